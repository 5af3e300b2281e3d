"""Whisper's languages: code -> English name, and the other names users may type.

The table of OpenAI's whisper (tokenizer.py, MIT), as transformers' WhisperTokenizer also
holds it; kept here so that checking a request's language imports neither.
"""

from __future__ import annotations

LANGUAGES: dict[str, str] = {
    "en": "english",
    "zh": "chinese",
    "de": "german",
    "es": "spanish",
    "ru": "russian",
    "ko": "korean",
    "fr": "french",
    "ja": "japanese",
    "pt": "portuguese",
    "tr": "turkish",
    "pl": "polish",
    "ca": "catalan",
    "nl": "dutch",
    "ar": "arabic",
    "sv": "swedish",
    "it": "italian",
    "id": "indonesian",
    "hi": "hindi",
    "fi": "finnish",
    "vi": "vietnamese",
    "he": "hebrew",
    "uk": "ukrainian",
    "el": "greek",
    "ms": "malay",
    "cs": "czech",
    "ro": "romanian",
    "da": "danish",
    "hu": "hungarian",
    "ta": "tamil",
    "no": "norwegian",
    "th": "thai",
    "ur": "urdu",
    "hr": "croatian",
    "bg": "bulgarian",
    "lt": "lithuanian",
    "la": "latin",
    "mi": "maori",
    "ml": "malayalam",
    "cy": "welsh",
    "sk": "slovak",
    "te": "telugu",
    "fa": "persian",
    "lv": "latvian",
    "bn": "bengali",
    "sr": "serbian",
    "az": "azerbaijani",
    "sl": "slovenian",
    "kn": "kannada",
    "et": "estonian",
    "mk": "macedonian",
    "br": "breton",
    "eu": "basque",
    "is": "icelandic",
    "hy": "armenian",
    "ne": "nepali",
    "mn": "mongolian",
    "bs": "bosnian",
    "kk": "kazakh",
    "sq": "albanian",
    "sw": "swahili",
    "gl": "galician",
    "mr": "marathi",
    "pa": "punjabi",
    "si": "sinhala",
    "km": "khmer",
    "sn": "shona",
    "yo": "yoruba",
    "so": "somali",
    "af": "afrikaans",
    "oc": "occitan",
    "ka": "georgian",
    "be": "belarusian",
    "tg": "tajik",
    "sd": "sindhi",
    "gu": "gujarati",
    "am": "amharic",
    "yi": "yiddish",
    "lo": "lao",
    "uz": "uzbek",
    "fo": "faroese",
    "ht": "haitian creole",
    "ps": "pashto",
    "tk": "turkmen",
    "nn": "nynorsk",
    "mt": "maltese",
    "sa": "sanskrit",
    "lb": "luxembourgish",
    "my": "myanmar",
    "bo": "tibetan",
    "tl": "tagalog",
    "mg": "malagasy",
    "as": "assamese",
    "tt": "tatar",
    "haw": "hawaiian",
    "ln": "lingala",
    "ha": "hausa",
    "ba": "bashkir",
    "jw": "javanese",
    "su": "sundanese",
    "yue": "cantonese",
}

# Names -> codes: every English name above, plus the aliases OpenAI accepts.
TO_LANGUAGE_CODE: dict[str, str] = {
    **{name: code for code, name in LANGUAGES.items()},
    "burmese": "my",
    "valencian": "ca",
    "flemish": "nl",
    "haitian": "ht",
    "letzeburgesch": "lb",
    "pushto": "ps",
    "panjabi": "pa",
    "moldavian": "ro",
    "moldovan": "ro",
    "sinhalese": "si",
    "castilian": "es",
    "mandarin": "zh",
}

# ISO 639-2 (bibliographic and terminological) and ISO 639-3 codes of Whisper's languages, as
# other tools and files' metadata write them ("deu", "ger"): Whisper's code, then its others.
# ("haw" and "yue" are Whisper's own codes already.)
_ISO_639_CODES = """
en eng; zh zho chi cmn; de deu ger; es spa; ru rus; ko kor; fr fra fre; ja jpn; pt por; tr tur
pl pol; ca cat; nl nld dut; ar ara arb; sv swe; it ita; id ind; hi hin; fi fin; vi vie; he heb
uk ukr; el ell gre; ms msa may zsm; cs ces cze; ro ron rum; da dan; hu hun; ta tam; no nor nob
th tha; ur urd; hr hrv; bg bul; lt lit; la lat; mi mri mao; ml mal; cy cym wel; sk slk slo
te tel; fa fas per pes; lv lav lvs; bn ben; sr srp; az aze azj; sl slv; kn kan; et est ekk
mk mkd mac; br bre; eu eus baq; is isl ice; hy hye arm; ne nep npi; mn mon khk; bs bos; kk kaz
sq sqi alb; sw swa swh; gl glg; mr mar; pa pan; si sin; km khm; sn sna; yo yor; so som; af afr
oc oci; ka kat geo; be bel; tg tgk; sd snd; gu guj; am amh; yi yid; lo lao; uz uzb uzn; fo fao
ht hat; ps pus pbt; tk tuk; nn nno; mt mlt; sa san; lb ltz; my mya bur; bo bod tib
tl tgl fil; mg mlg; as asm; tt tat; ln lin; ha hau; ba bak; jw jav; su sun
"""

# Other codes users type -> Whisper's: the ISO 639-2/3 codes above, and two-letter codes that
# were retired (iw, in, ji, mo) or that Whisper spells differently (jv, nb).
OTHER_CODES: dict[str, str] = {
    other: codes.split()[0]
    for codes in _ISO_639_CODES.replace("\n", ";").split(";")
    if codes.strip()
    for other in codes.split()[1:]
} | {"iw": "he", "in": "id", "ji": "yi", "jv": "jw", "nb": "no", "mo": "ro"}

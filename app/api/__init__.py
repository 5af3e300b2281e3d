"""specscribe's OpenAI-compatible HTTP API (mounted beside the web UI by `app.server`).

Modules, one job each: errors (OpenAI's error shape), work_queue (one-at-a-time model work with
a bounded wait), audio_request (the multipart form -> AudioRequest), audio_formats (Transcript ->
json/text/srt/vtt/verbose_json), audio_routes (the audio endpoints), text_front (the loaded text
LM and one completion), text_routes (the completion endpoints), app (build_api, auth, models).
"""

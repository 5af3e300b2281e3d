"""`POST /v1/completions` and `POST /v1/chat/completions` on the text front.

OpenAI's request fields (`model`, `prompt` / `messages`, `max_tokens` (chat: or
`max_completion_tokens`), `temperature`, `top_p`, `seed`, `stop`, `stream`, `stream_options`,
`n` = 1, `user`), and those stock clients send at values that change nothing (penalties of 0,
no logprobs, an empty `logit_bias`, `parallel_tool_calls`; chat: `tool_choice` none, a text
`response_format`, `store` false, `metadata`; completions: `echo` false, `best_of` 1); other
values of those are refused with 422, as is a field of another JSON type than OpenAI's (no
"5" for 5), anything else with 400.
temperature 0 is greedy decoding (OpenAI's default is 1: sampling). The response carries
OpenAI's `usage` and specscribe's `stats` (target and draft calls, tokens per target call).
Chat completions exist when the model has a chat template; without `--text-model` both routes
answer 503.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from decoding import SamplingOptions

from ..request import echoed
from .audio_routes import CLIENT_CLOSED_REQUEST, queue_full
from .errors import ApiError, error_body
from .events import sse
from .text_front import Completion, TextFront
from .work_queue import (
    Abandoned,
    ClosingStream,
    QueueFull,
    ShuttingDown,
    WorkQueue,
    until_stopped,
)

log = logging.getLogger(__name__)

COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
CHAT_MAX_TOKENS = 1024  # chat default: this, or what the context leaves
MAX_STOPS = 4


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    include_usage: bool = False


class _Common(BaseModel):
    """Fields both routes take."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)  # torch's generator seeds
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1
    user: str | None = None  # OpenAI's end-user id; recorded nowhere
    # What stock clients send at values that change nothing; any other value is refused (422).
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _no_penalty(cls, value: float) -> float:
        if value != 0:
            raise ValueError("penalties are not supported: only 0")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("logit_bias is not supported: only {} or null")
        return value

    @property
    def token_limit(self) -> int | None:
        """The most tokens to generate, as asked (None: the route's default)."""
        return self.max_tokens

    @property
    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOPS:
            raise ApiError(422, f"stop: at most {MAX_STOPS} sequences", param="stop")
        return stops

    def sampling(self) -> SamplingOptions | None:
        """None (greedy) at temperature 0; else the options, checked (422 naming the field)."""
        if self.temperature == 0:
            return None
        options = SamplingOptions(temperature=self.temperature, top_p=self.top_p, seed=self.seed)
        try:
            return options.validate()
        except ValueError as error:
            field = str(error).split(" ")[0]
            raise ApiError(
                422, str(error), param=field if field in ("temperature", "top_p") else None
            ) from None


class CompletionRequest(_Common):
    prompt: str | list[str]
    # OpenAI's, at the values that change nothing (others are refused with 422).
    logprobs: Literal[0] | None = None
    echo: Literal[False] = False
    best_of: Literal[1] | None = None
    suffix: Literal[""] | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and len(value) != 1:
            raise ValueError("one prompt per request (a list of exactly one string)")
        return value

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        """Parts of other types (image_url, input_audio, file) are named as what is refused,
        not listed as unknown fields of a text part."""
        if isinstance(value, list):
            kinds = {part.get("type") for part in value if isinstance(part, dict)}
            others = sorted(str(kind) for kind in kinds - {"text", None})  # None: untyped
            if others:
                raise ValueError(f"only text content parts are read, not {', '.join(others)} parts")
        return value

    def plain(self) -> dict[str, str]:
        content = self.content
        text = content if isinstance(content, str) else "".join(p.text for p in content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class PlainText(BaseModel):
    """A chat response_format: text is the one there is."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["text"]


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    # The chat route's current name for max_tokens (the SDK sends it); both: they must agree.
    max_completion_tokens: int | None = Field(None, ge=1)
    # OpenAI's, at the values that change nothing (others are refused with 422); no tools are
    # offered, so parallel_tool_calls has nothing to run in parallel.
    logprobs: Literal[False] = False
    top_logprobs: Literal[0] | None = None
    parallel_tool_calls: bool | None = None
    tools: list[dict[str, Any]] | None = None  # none offered: [] or null only
    tool_choice: Literal["none"] | None = None
    response_format: PlainText | None = None
    store: Literal[False] | None = None  # nothing is kept for OpenAI's stored completions
    metadata: dict[str, str] | None = None  # tags for stored completions: none are stored

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if value:
            raise ValueError("tools are not supported: only [] or null")
        return value

    @field_validator("max_completion_tokens")
    @classmethod
    def _one_limit(cls, value: int | None, info) -> int | None:
        given = info.data.get("max_tokens")
        if value is not None and given is not None and given != value:
            raise ValueError(f"differs from max_tokens ({given}): give one of them")
        return value

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class TextApi:
    """The text routes over one TextFront (or none) and the API's WorkQueue."""

    def __init__(self, front: TextFront | None, work: WorkQueue) -> None:
        self.front = front
        self.work = work

    def router(self) -> APIRouter:
        router = APIRouter()

        @router.post("/v1/completions")
        async def completions(request: Request) -> Response:
            front = self._front()
            asked = _parse(CompletionRequest, await _json(request))
            # Off the event loop: a long prompt held every other request (/health too).
            prompt = await asyncio.to_thread(front.prompt_ids, asked.text)
            if not prompt:  # an empty prompt, for a model without a BOS token to start from
                raise ApiError(
                    422, f"prompt is empty, and {front.name} needs text to continue", param="prompt"
                )
            return await self._answer(request, front, asked, prompt, "text")

        @router.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            front = self._front()
            if not front.has_chat_template:
                # 404, as OpenAI answers a model that is not a chat model: the request cannot
                # succeed here, and a 5xx would have the SDKs retry it.
                raise ApiError(
                    404,
                    f"{front.name} is not a chat model (it has no chat template): use "
                    "/v1/completions",
                    code="chat_not_supported",
                )
            asked = _parse(ChatRequest, await _json(request))
            messages = [message.plain() for message in asked.messages]
            try:
                prompt = await asyncio.to_thread(front.chat_ids, messages)
            except ValueError as error:  # a control token in a message's text
                raise ApiError(422, str(error), param="messages") from None
            return await self._answer(request, front, asked, prompt, "chat")

        return router

    def _front(self) -> TextFront:
        if self.front is None:
            raise ApiError(
                503,
                "no text model is loaded: start `specscribe serve --text-model NAME`",
                code="text_model_not_loaded",
            )
        return self.front

    async def _answer(
        self,
        request: Request,
        front: TextFront,
        asked: _Common,
        prompt: list[int],
        kind: Literal["text", "chat"],
    ) -> Response:
        # 1. The request against the model: its name, the stop strings, the context.
        if asked.model != front.name:
            raise ApiError(
                404,
                f"model {echoed(asked.model)} is not this server's text model: {front.name!r} is",
                param="model",
                code="model_not_found",
            )
        stops = asked.stops
        max_tokens = asked.token_limit or _default_max_tokens(front, len(prompt), kind)
        context = front.context
        if context is not None and len(prompt) + max_tokens > context:
            given = "prompt" if kind == "text" else "messages"
            if asked.token_limit is None:  # the default fits what is left: nothing is
                message = f"the {given} ({len(prompt)} tokens) fill {front.name}'s context"
                param = given
            else:
                message = f"the {given} ({len(prompt)} tokens) and max_tokens ({max_tokens})"
                message += f" exceed {front.name}'s context"
                param = "max_tokens"
            raise ApiError(
                422,
                f"{message} of {context} tokens",
                param=param,
                code="context_length_exceeded",
            )
        sampling = asked.sampling()
        shape = _Shape(kind, front.name)
        # 2. Generate in the queue, streamed or whole.
        if asked.stream:
            return self._stream(front, prompt, max_tokens, sampling, stops, shape, asked)
        # A client gone, or a stop past its grace, ends the generation at its next piece of
        # text (it ran to max_tokens, holding the queue's one worker).
        stop = threading.Event()
        try:
            done = await self.work.run(
                lambda: front.complete(
                    prompt, max_tokens, sampling, stops, until_stopped(stop, _ignored)
                ),
                abandoned=request.is_disconnected,  # a client gone gives its place back
                stop=stop,
            )
        except QueueFull:
            raise queue_full(self.work) from None
        except Abandoned:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        except ValueError as error:
            raise ApiError(422, str(error)) from None
        return JSONResponse(shape.whole(done))

    def _stream(self, front, prompt, max_tokens, sampling, stops, shape, asked) -> Response:
        stop = threading.Event()  # set when the stream ends early: the generation stops too
        try:
            done, pieces = self.work.submit_streaming(
                lambda emit: front.complete(
                    prompt, max_tokens, sampling, stops, until_stopped(stop, emit)
                )
            )
        except QueueFull:
            raise queue_full(self.work) from None
        done.add_done_callback(lambda d: stop.set() if d.cancelled() else None)
        include_usage = bool(asked.stream_options and asked.stream_options.include_usage)
        return ClosingStream(
            _chunks(done, pieces, shape, include_usage),
            on_close=done.cancel,  # a no-op once it is done; else its place is given back
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )


def _ignored(piece: str) -> None:
    """A whole completion's pieces: only its stop is read between them."""


def _default_max_tokens(front: TextFront, prompt: int, kind: str) -> int:
    if kind == "text":
        return COMPLETION_MAX_TOKENS
    left = (front.context or prompt + CHAT_MAX_TOKENS) - prompt
    return max(1, min(CHAT_MAX_TOKENS, left))


class _Shape:
    """OpenAI's response objects for one request: text_completion or chat.completion."""

    def __init__(self, kind: Literal["text", "chat"], model: str) -> None:
        self.kind = kind
        self.model = model
        prefix = "cmpl" if kind == "text" else "chatcmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _head(self, chunk: bool) -> dict[str, Any]:
        obj = "text_completion" if self.kind == "text" else "chat.completion"
        if chunk and self.kind == "chat":
            obj = "chat.completion.chunk"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, done: Completion) -> dict[str, Any]:
        if self.kind == "text":
            choice = {"index": 0, "text": done.text, "logprobs": None}
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": done.text}}
        choice["finish_reason"] = done.finish_reason
        return {
            **self._head(chunk=False),
            "choices": [choice],
            "usage": _usage(done),
            "stats": done.stats_dict(),
        }

    def chunk(self, text: str | None, finish: str | None = None, first: bool = False) -> dict:
        if self.kind == "text":
            choice = {"index": 0, "text": text or "", "logprobs": None}
        else:
            delta: dict[str, str] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta}
        choice["finish_reason"] = finish
        return {**self._head(chunk=True), "choices": [choice]}


def _usage(done: Completion) -> dict[str, int]:
    generated = len(done.tokens)
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": generated,
        "total_tokens": done.prompt_tokens + generated,
    }


async def _chunks(
    done: asyncio.Future[Completion],
    pieces: AsyncIterator[str],
    shape: _Shape,
    include_usage: bool,
) -> AsyncIterator[str]:
    """OpenAI's streamed chunks, the last with finish_reason; a usage chunk when asked for
    (with the decode statistics); then `[DONE]`. An error becomes one `{"error": ...}`."""
    first = shape.kind == "chat"
    try:
        if first:
            yield sse(shape.chunk(None, first=True))
        async for piece in pieces:
            yield sse(shape.chunk(piece))
        completion = done.result()
    except (ApiError, ValueError) as error:
        status = error.status if isinstance(error, ApiError) else 422
        yield sse(error_body(status, getattr(error, "message", str(error))))
        return
    except ShuttingDown as error:  # waiting or running when the server began to stop
        yield sse(error_body(503, str(error), code="shutting_down"))
        return
    except Exception as error:  # the stream ended with no word and no [DONE]: say it failed
        log.exception("a streamed completion failed")
        yield sse(error_body(500, f"the completion failed ({type(error).__name__})"))
        return
    yield sse(shape.chunk("" if shape.kind == "text" else None, finish=completion.finish_reason))
    if include_usage:
        yield sse(
            {
                **shape._head(chunk=True),
                "choices": [],
                "usage": _usage(completion),
                "stats": completion.stats_dict(),
            }
        )
    yield "data: [DONE]\n\n"


# The largest text request read (its JSON body): far more than any embedded model's context
# holds (32k tokens of text escaped as JSON is under 300 kB). An unbounded body was read whole
# and tokenized on the event loop: 10 MB held every request (/health too) for 8 s, 300 MB
# grew the server past its memory.
MAX_TEXT_REQUEST_BYTES = 1 << 20


async def _json(request: Request) -> Any:
    content_type = request.headers.get("content-type", "")
    if content_type.partition(";")[0].strip().lower() != "application/json":
        raise ApiError(
            415,
            f"send the request as application/json (got {content_type or 'none'})",
            code="unsupported_media_type",
        )
    body = await _body_within(request, MAX_TEXT_REQUEST_BYTES)
    try:
        return _without_lone_surrogates(json.loads(body))
    except ValueError as error:
        raise ApiError(400, f"the body is not valid JSON: {error}") from None
    except RecursionError:  # nesting deeper than the parser's stack
        raise ApiError(400, "the body is not valid JSON: nested too deeply") from None


async def _body_within(request: Request, limit: int) -> bytes:
    """The request's body, or a 413 once it says or sends more than `limit` bytes."""

    def too_large(size: int, sent: bool) -> ApiError:
        has = "went past" if sent else "has"
        return ApiError(
            413,
            f"the request {has} {size} bytes, more than the {limit} a text request may hold",
            code="request_too_large",
        )

    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared), sent=False)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large(len(body), sent=True)
    return bytes(body)


def _without_lone_surrogates(value: Any) -> Any:
    """`value` (parsed JSON) with each unpaired UTF-16 surrogate in its strings as U+FFFD:
    JSON may escape one (\\ud83d, half an emoji a client cut), which Python keeps in a str but
    no tokenizer takes (a 500 before); `specscribe generate` reads bytes that are not UTF-8
    the same way."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [_without_lone_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {key: _without_lone_surrogates(item) for key, item in value.items()}
    return value


def _parse(model: type[BaseModel], body: Any):
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    # null is OpenAI's "not given" for every optional field, and the SDK sends it for an
    # argument passed as None (temperature=None was refused: "input should be a valid number").
    given = {key: value for key, value in body.items() if value is not None}
    try:
        # Strict: JSON's own types only, as OpenAI reads them ("max_tokens": "5" or true, and
        # "stream": "yes", were taken for 5, 1 and a stream).
        return model.model_validate(given, strict=True)
    except ValidationError as error:
        problems = error.errors()
        unknown = [".".join(map(str, p["loc"])) for p in problems if p["type"] == "extra_forbidden"]
        if unknown:
            return_error = ApiError(
                400,
                f"unknown field {', '.join(unknown)} (accepted: {', '.join(model.model_fields)})",
                param=unknown[0],
                code="unknown_parameter",
            )
        else:
            missing = [p for p in problems if p["type"] == "missing"]
            status = 400 if missing else 422
            return_error = ApiError(
                status,
                "; ".join(
                    f"{'.'.join(map(str, p['loc']))}: {p['msg']} (got {echoed(p.get('input'))})"
                    for p in problems
                ),
                param=".".join(map(str, problems[0]["loc"])) or None,
            )
        raise return_error from None

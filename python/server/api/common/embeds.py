"""vLLM's ``prompt_embeds`` on /v1/completions: base64 ``torch.save`` tensors
[num_tokens, hidden_size] taken as prompts (``--enable-prompt-embeds``), decoded safely.

vLLM hands the caller's bytes to ``torch.load(weights_only=True)`` as they come. That
unpickler refuses arbitrary callables, but it still runs a pickle the caller wrote, reads
any archive, and builds whatever tensor the pickle describes: a sparse tensor (whose
invariants vLLM must check), a parameter or subclass, or a view whose sizes and strides
span far more elements than the payload holds (stride 0), which the first copy then
materializes. Here nothing is unpickled until the payload is known to be exactly what
``torch.save(tensor)`` writes for one dense tensor, and nothing is materialized until its
shape is known to be bounded:

1. size: the base64 text is refused above the bytes that max_model_len rows of
   hidden_size float64 values take (plus the archive's own bytes), before it is decoded;
2. base64, strictly (no characters outside the alphabet);
3. the archive (Python's zipfile, nothing decompressed): a zip of stored, uncompressed
   entries with distinct names under one folder, its ``data.pkl`` at most
   ``MAX_PICKLE_BYTES`` and exactly one storage record;
4. the pickle, read opcode by opcode (``pickletools``, nothing executed): protocol 2 as
   ``torch.save`` writes it, only the opcodes of one tensor, only the globals
   ``torch._utils._rebuild_tensor_v2``, a ``torch.<dtype>Storage`` and
   ``collections.OrderedDict``, one storage reference;
5. only then ``torch.load(weights_only=True)``, whose result must be a plain dense tensor
   whose elements are no more than its storage holds, 2-D (or 3-D with a leading 1,
   squeezed, as vLLM does), hidden_size wide, of a floating-point dtype (converted to
   float32, the activations' dtype), with at least one row and no NaN or infinity.

Every refusal is a 400 naming ``prompt_embeds``, in vLLM's words where vLLM has words for
it; no library's exception text is echoed. The prompt's length (truncate_prompt_tokens,
max_model_len) is judged with the other prompts' in the tokenizer actor, on one placeholder
id per row (actors.params.embeds). Decoding runs in a worker thread.
"""

from __future__ import annotations

import base64
import binascii
import io
import pickletools
import zipfile

import trio
from actors.params.embeds import PromptEmbeds

from server.api.common.completion_protocol import CompletionRequest
from server.api.common.params import MAX_PROMPTS
from server.errors import bad_request

__all__ = ["MAX_PICKLE_BYTES", "check_request", "decode", "decoded_prompts"]

PARAM = "prompt_embeds"
FLAG_OFF = "You must set `--enable-prompt-embeds` to input `prompt_embeds`."
# torch.save's pickle of one tensor is about 160 bytes; its archive's other entries (version,
# byte order, serialization id) and zip headers about 1.5 KB.
MAX_PICKLE_BYTES = 4096
ARCHIVE_SLACK = 64 << 10
ONE_TENSOR = "the archive must hold exactly one dense tensor and nothing else"
MAX_ENTRIES = 16

_STORAGES = frozenset(f"{t}Storage" for t in (
    "Float", "Double", "Half", "BFloat16",  # the floating-point ones, converted
    "Long", "Int", "Short", "Char", "Byte", "Bool"))  # refused by dtype, in vLLM's words
_GLOBALS = frozenset({("torch._utils", "_rebuild_tensor_v2"), ("collections", "OrderedDict"),
                      *(("torch", s) for s in _STORAGES)})
# Every opcode torch.save's protocol-2 pickle of one tensor uses; nothing that builds an
# object (but the two REDUCEs of the allowed globals), nor imports one by a computed name.
_OPCODES = frozenset({
    "PROTO", "FRAME", "STOP", "MARK", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_TUPLE",
    "BINPUT", "LONG_BINPUT", "MEMOIZE", "BINGET", "LONG_BINGET", "BINUNICODE",
    "SHORT_BINUNICODE", "BININT", "BININT1", "BININT2", "LONG1", "NEWTRUE", "NEWFALSE",
    "NONE", "GLOBAL", "BINPERSID", "REDUCE"})

_limiter = trio.CapacityLimiter(2)


class _NotOneTensor(Exception):
    """The payload is not what torch.save writes for one dense tensor."""


def max_payload_bytes(max_model_len: int, width: int) -> int:
    """The largest decoded payload taken: max_model_len rows of float64, and the archive."""
    return max_model_len * width * 8 + ARCHIVE_SLACK


def check_request(req: CompletionRequest) -> None:
    """The checks of a body's prompt_embeds that need no decoding, in vLLM's order."""
    embeds = req.prompt_embeds
    if embeds is None:
        return
    if isinstance(embeds, list) and len(embeds) > MAX_PROMPTS:
        raise bad_request(f"prompt_embeds list length {len(embeds)} exceeds the maximum "
                          f"allowed count of {MAX_PROMPTS}.", PARAM)
    if req.echo:
        raise bad_request("Echo is unsupported with prompt embeds.", "echo")
    if req.prompt_logprobs is not None:
        raise bad_request("prompt_logprobs is not compatible with prompt embeds.",
                          "prompt_logprobs")


async def decoded_prompts(req: CompletionRequest, *, width: int,
                          max_model_len: int) -> list[PromptEmbeds]:
    """The body's prompt_embeds decoded, in order (none: []), off the event loop. ``width``:
    the engine's (RequestLimits.prompt_embeds_width; 0: --enable-prompt-embeds is off)."""
    texts = req.prompt_embeds
    if texts is None:
        return []
    if isinstance(texts, str):
        texts = [texts]
    if not texts:
        return []
    if not width:
        raise bad_request(FLAG_OFF, PARAM)
    return await trio.to_thread.run_sync(
        lambda: [decode(t, width=width, max_model_len=max_model_len) for t in texts],
        limiter=_limiter)


def decode(text: str, *, width: int, max_model_len: int) -> PromptEmbeds:
    """One base64 prompt_embeds item as float32 rows; a 400 naming the field if it is
    anything but one dense floating-point tensor [rows, width] of finite values."""
    limit = max_payload_bytes(max_model_len, width)
    if len(text) > 4 * -(-limit // 3):
        raise bad_request(f"`prompt_embeds` is {len(text)} base64 characters, more than "
                          f"{max_model_len} rows of {width} values take", PARAM)
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request("`prompt_embeds` is not valid base64", PARAM) from None
    try:
        _check_archive(raw)
    except _NotOneTensor as exc:
        raise bad_request(f"`prompt_embeds` could not be deserialized as a torch tensor: "
                          f"{exc}", PARAM) from None
    return _rows(_load(raw), width)


def _check_archive(raw: bytes) -> None:
    """Raises _NotOneTensor unless ``raw`` is torch.save's archive of one tensor."""
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:
            infos = zf.infolist()
            names = [i.filename for i in infos]
            if not infos or len(infos) > MAX_ENTRIES or len(set(names)) != len(names):
                raise _NotOneTensor("not a torch.save archive")
            root = names[0].split("/", 1)[0]
            if any(not n.startswith(root + "/") for n in names):
                raise _NotOneTensor("not a torch.save archive")
            if any(i.compress_type != zipfile.ZIP_STORED or i.compress_size != i.file_size
                   for i in infos) or sum(i.file_size for i in infos) > len(raw):
                raise _NotOneTensor("compressed archive entries are refused")
            records = [n for n in names if n.startswith(f"{root}/data/")]
            pickle_info = next((i for i in infos if i.filename == f"{root}/data.pkl"), None)
            if pickle_info is None or len(records) != 1:
                raise _NotOneTensor(ONE_TENSOR)
            if pickle_info.file_size > MAX_PICKLE_BYTES:
                raise _NotOneTensor(ONE_TENSOR)
            pickle = zf.read(pickle_info)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError):
        raise _NotOneTensor("not a torch.save archive") from None
    _check_pickle(pickle)


def _check_pickle(pickle: bytes) -> None:
    """Raises _NotOneTensor unless the pickle builds one tensor and nothing else."""
    globals_seen: list[tuple[str, str]] = []
    persistent = 0
    try:
        for op, arg, _ in pickletools.genops(pickle):
            name = op.name
            if name not in _OPCODES:
                raise _NotOneTensor(ONE_TENSOR)
            if name == "PROTO" and arg != 2:
                raise _NotOneTensor("the tensor must be saved with torch.save's default "
                                    "pickle protocol")
            if name == "GLOBAL":
                module, _, attr = str(arg).partition(" ")
                if (module, attr) not in _GLOBALS:
                    raise _NotOneTensor(ONE_TENSOR)
                globals_seen.append((module, attr))
            elif name == "BINPERSID":
                persistent += 1
    except ValueError:  # pickletools: a truncated or unknown opcode
        raise _NotOneTensor("its pickle is malformed") from None
    if (persistent != 1 or not globals_seen
            or globals_seen[0] != ("torch._utils", "_rebuild_tensor_v2")
            or sum(g[0] == "torch" for g in globals_seen) != 1):
        raise _NotOneTensor(ONE_TENSOR)


def _load(raw: bytes):  # -> torch.Tensor
    import torch

    try:
        t = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except (MemoryError, torch.OutOfMemoryError):
        raise
    except Exception:  # noqa: BLE001 - the caller's bytes; torch has no one error type
        raise bad_request("`prompt_embeds` could not be deserialized as a torch tensor",
                          PARAM) from None
    if type(t) is not torch.Tensor or t.layout != torch.strided or t.is_quantized:
        raise bad_request("`prompt_embeds` must be one dense tensor", PARAM)
    return t


def _rows(t, width: int) -> PromptEmbeds:  # t: torch.Tensor
    import torch

    if t.dim() > 2:
        t = t.squeeze(0)
    if t.dim() != 2:
        raise bad_request(f"`prompt_embeds` must be a 2D tensor of shape (num_tokens, "
                          f"hidden_size); got shape {tuple(t.shape)}.", PARAM)
    if t.shape[1] != width:
        raise bad_request(f"`prompt_embeds` hidden_size {t.shape[1]} does not match the "
                          f"model's hidden_size {width}.", PARAM)
    if not t.is_floating_point():
        raise bad_request(f"`prompt_embeds` dtype {t.dtype} is not a floating-point type, "
                          f"cannot safely cast to the model's dtype {torch.float32}.", PARAM)
    # Sizes and strides come from the caller's pickle: a view (stride 0) may span far more
    # elements than the payload holds, which the copy below would materialize.
    if t.numel() > t.untyped_storage().nbytes() // t.element_size():
        raise bad_request("`prompt_embeds` has more elements than its storage holds", PARAM)
    if not t.shape[0]:
        raise bad_request("`prompt_embeds` must hold at least one row", PARAM)
    try:
        return PromptEmbeds.of(t.detach().to(torch.float32).contiguous().numpy())
    except ValueError:  # the rows are 2-D and non-empty: what is left is their values
        raise bad_request("`prompt_embeds` holds NaN or infinity", PARAM) from None

"""server.api.common.embeds.decode: a prompt_embeds item is taken only when it is one dense
floating-point tensor as torch.save writes it, [rows, hidden_size], finite, bounded; every
other payload is a 400 naming prompt_embeds, decided before anything the caller wrote is
unpickled (the pickle bombs below would run a command or build other objects under a plain
torch.load), and no refusal echoes a library's text."""

from __future__ import annotations

import base64
import io
import zipfile

import numpy as np
import pytest
import torch
from server.api.common import embeds
from server.errors import APIError

WIDTH = 8
MAX_LEN = 32


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def saved(obj: object, **kwargs: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, **kwargs)
    return buf.getvalue()


def with_pickle(pickle: bytes) -> bytes:
    """A real torch.save archive of one tensor whose data.pkl is replaced by ``pickle``."""
    src = zipfile.ZipFile(io.BytesIO(saved(torch.zeros(2, WIDTH))))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = pickle if info.filename.endswith("/data.pkl") else src.read(info)
            dst.writestr(info.filename, data)
    return out.getvalue()


def refused(payload: str, **limits: int) -> APIError:
    with pytest.raises(APIError) as caught:
        embeds.decode(payload, **{"width": WIDTH, "max_model_len": MAX_LEN, **limits})
    err = caught.value
    assert err.status == 400 and err.param == "prompt_embeds", err.message
    assert len(err.message) < 300
    return err


def test_a_saved_tensor_becomes_float32_rows_in_order() -> None:
    t = torch.arange(3 * WIDTH, dtype=torch.float64).reshape(3, WIDTH) / 7
    got = embeds.decode(b64(saved(t)), width=WIDTH, max_model_len=MAX_LEN)
    assert got.data.dtype == np.float32 and got.data.shape == (3, WIDTH)
    np.testing.assert_array_equal(got.data, t.to(torch.float32).numpy())
    assert got.digest == embeds.decode(b64(saved(t)), width=WIDTH,
                                       max_model_len=MAX_LEN).digest


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_floating_dtypes_and_a_leading_batch_of_one_are_taken(dtype) -> None:
    t = torch.randn(1, 4, WIDTH).to(dtype)
    got = embeds.decode(b64(saved(t)), width=WIDTH, max_model_len=MAX_LEN)
    np.testing.assert_array_equal(got.data, t[0].to(torch.float32).numpy())


def test_a_view_saves_and_loads_its_own_rows() -> None:
    big = torch.randn(10, WIDTH)
    got = embeds.decode(b64(saved(big[3:6])), width=WIDTH, max_model_len=MAX_LEN)
    np.testing.assert_array_equal(got.data, big[3:6].numpy())


def test_not_base64() -> None:
    assert "base64" in refused("not base64!").message
    assert "base64" in refused("Zm9v\u00e9").message  # non-ASCII


@pytest.mark.parametrize("raw", [
    b"", b"\x80", b"hello world, no torch file", b"PK\x03\x04" + b"\x00" * 20,
    b"\x80\x04K*.",  # pickle.dumps(42): a pickle, not an archive
], ids=["empty", "one-byte", "text", "truncated-zip", "bare-pickle"])
def test_not_an_archive(raw: bytes) -> None:
    assert "could not be deserialized as a torch tensor" in refused(b64(raw)).message


def test_a_zip_without_a_tensor() -> None:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("archive/junk.txt", "hello")
    refused(b64(out.getvalue()))


def test_a_compressed_archive() -> None:
    src = zipfile.ZipFile(io.BytesIO(saved(torch.zeros(2, WIDTH))))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    assert "compressed" in refused(b64(out.getvalue())).message


@pytest.mark.parametrize("pickle", [
    b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03.",  # os.system
    b"\x80\x02cbuiltins\neval\nX\x03\x00\x00\x001+1\x85R.",  # eval
    b"\x80\x02}q\x00.",  # an empty dict
], ids=["os-system", "eval", "dict"])
def test_a_pickle_that_builds_anything_else(pickle: bytes) -> None:
    assert "torch tensor" in refused(b64(with_pickle(pickle))).message


@pytest.mark.parametrize("obj", [
    {"x": torch.zeros(2, WIDTH)},
    [torch.zeros(2, WIDTH), torch.ones(2, WIDTH)],
    (torch.zeros(2, WIDTH),),
    torch.nn.Parameter(torch.zeros(2, WIDTH)),
    torch.zeros(2, WIDTH).to_sparse(),
    torch.zeros(2, WIDTH, dtype=torch.complex64),
    "a string",
], ids=["dict", "list", "tuple", "parameter", "sparse", "complex", "str"])
def test_other_saved_objects(obj: object) -> None:
    refused(b64(saved(obj)))


def test_a_stride_zero_view_larger_than_its_payload() -> None:
    # One row saved, read as MAX_LEN rows: the copy would materialize what was never sent.
    wide = torch.zeros(1, WIDTH).expand(MAX_LEN, WIDTH)
    assert "storage" in refused(b64(saved(wide))).message


def test_a_later_pickle_protocol() -> None:
    assert "protocol" in refused(b64(saved(torch.zeros(2, WIDTH), pickle_protocol=4))).message


def test_shape_dtype_and_values_in_vllms_words() -> None:
    msg = refused(b64(saved(torch.zeros(3, WIDTH + 1)))).message
    assert msg == (f"`prompt_embeds` hidden_size {WIDTH + 1} does not match the model's "
                   f"hidden_size {WIDTH}.")
    msg = refused(b64(saved(torch.zeros(WIDTH)))).message
    assert msg == ("`prompt_embeds` must be a 2D tensor of shape (num_tokens, hidden_size); "
                   f"got shape ({WIDTH},).")
    refused(b64(saved(torch.zeros(2, 3, WIDTH))))
    msg = refused(b64(saved(torch.zeros(2, WIDTH, dtype=torch.int64)))).message
    assert msg == ("`prompt_embeds` dtype torch.int64 is not a floating-point type, cannot "
                   "safely cast to the model's dtype torch.float32.")
    assert "at least one row" in refused(b64(saved(torch.zeros(0, WIDTH)))).message
    for bad in (float("nan"), float("inf"), 1e300):  # 1e300: infinite as float32
        t = torch.zeros(2, WIDTH, dtype=torch.float64)
        t[1, 3] = bad
        assert "NaN or infinity" in refused(b64(saved(t))).message


def test_the_size_bound_is_checked_before_decoding() -> None:
    limit = embeds.max_payload_bytes(MAX_LEN, WIDTH)
    text = "A" * (4 * -(-limit // 3) + 4)  # valid base64, never decoded
    assert "more than" in refused(text).message
    # rows beyond the context but within the bytes: decoded, the prompt check judges them
    got = embeds.decode(b64(saved(torch.zeros(MAX_LEN + 1, WIDTH))), width=WIDTH,
                        max_model_len=MAX_LEN)
    assert got.num_rows == MAX_LEN + 1

"""Weight files: found from the flag, then $VGEN_WEIGHTS_DIR, then ~/.cache/vgen; checked by SHA-256 where the
reference hash is known; a missing or foreign file is an error that says what to do."""

from __future__ import annotations

import hashlib

import pytest
import torch
from torch import nn

from vgen.eval import weights as w
from vgen.eval.weights import WeightsError, WeightsSpec, check_hash, find_weights, load_into, load_state_dict


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    env, cache = tmp_path / "env", tmp_path / "cache"
    env.mkdir(), cache.mkdir()
    monkeypatch.setattr(w, "CACHE_DIR", cache)
    monkeypatch.setenv(w.WEIGHTS_ENV, str(env))
    return env, cache


SPEC = WeightsSpec("Test net weights", ("net-abc.pth", "net-alias.pth"), None, "https://example.org/net-abc.pth")


def test_flag_then_env_then_cache(dirs, tmp_path, monkeypatch) -> None:
    env, cache = dirs
    (cache / "net-abc.pth").write_bytes(b"cache")
    assert find_weights(SPEC) == cache / "net-abc.pth"
    (env / "net-alias.pth").write_bytes(b"env")  # any published name counts
    assert find_weights(SPEC) == env / "net-alias.pth"
    (tmp_path / "mine.pth").write_bytes(b"flag")
    assert find_weights(SPEC, tmp_path / "mine.pth") == tmp_path / "mine.pth"
    monkeypatch.delenv(w.WEIGHTS_ENV)
    assert find_weights(SPEC) == cache / "net-abc.pth"


def test_a_missing_file_names_itself_its_hash_and_where_to_put_it(dirs, tmp_path) -> None:
    env, cache = dirs
    spec = WeightsSpec("Test net weights", ("net-abc.pth",), "ab" * 32, "https://example.org/net-abc.pth")
    with pytest.raises(WeightsError) as e:
        find_weights(spec)
    message = str(e.value)
    for part in ("net-abc.pth", "ab" * 32, str(env), str(cache), "--weights PATH", "https://example.org/net-abc.pth"):
        assert part in message
    with pytest.raises(WeightsError, match=f"weights file not found: {tmp_path / 'nope.pth'}.*SHA-256 {'ab' * 32}"):
        find_weights(spec, tmp_path / "nope.pth")


def test_hash_check(tmp_path) -> None:
    path = tmp_path / "f.pth"
    path.write_bytes(b"some weights")
    digest = hashlib.sha256(b"some weights").hexdigest()
    known = WeightsSpec("Known", ("f.pth",), digest, "x")
    other = WeightsSpec("Known", ("f.pth",), "0" * 64, "x")
    assert check_hash(known, path) == (digest, True)
    assert check_hash(SPEC, path) == (digest, None)  # no reference hash: recorded, not judged
    with pytest.raises(WeightsError, match=f"not the reference Known: its SHA-256 is {digest}, expected 0000"):
        check_hash(other, path)
    assert check_hash(other, path, verify=False) == (digest, False)


def test_state_dict_files_and_strict_loading(tmp_path) -> None:
    net = nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2))
    state = {k: v for k, v in net.state_dict().items() if "num_batches" not in k}
    torch.save({"state_dict": state}, tmp_path / "wrapped.pt")
    load_into(nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2)), load_state_dict(tmp_path / "wrapped.pt"), "net")
    torch.save({"a": 1}, tmp_path / "ints.pt")
    with pytest.raises(WeightsError, match="does not hold a state dict of tensors"):
        load_state_dict(tmp_path / "ints.pt")
    torch.save({**state, "extra.weight": torch.zeros(1)}, tmp_path / "extra.pt")
    with pytest.raises(WeightsError, match=r"do not fit net: unexpected 1 \(extra.weight\)"):
        load_into(nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2)), load_state_dict(tmp_path / "extra.pt"), "net")

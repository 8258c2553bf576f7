"""``import xgrad`` leaves JAX's configuration alone; the persistent compilation cache is opt-in."""

import os

from _scripts import run_json

from xgrad import compile_cache


def test_import_changes_no_jax_setting_and_enabling_the_cache_later_works(tmp_path):
    result = run_json(
        f"""
        import json, os
        os.environ.pop("XGRAD_COMPILATION_CACHE", None)
        before = {{k: repr(v) for k, v in jax.config.values.items()}}
        import xgrad
        after = {{k: repr(v) for k, v in jax.config.values.items()}}
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        (xgrad.tensor([1.0, 2.0], requires_grad=True).sin() * 3).sum().backward()  # compiles with the cache off
        path = xgrad.enable_compilation_cache({str(tmp_path)!r})
        (xgrad.tensor([1.0, 2.0, 3.0], requires_grad=True).cos() * 5).sum().backward()  # new shapes: new programs
        files = len(os.listdir(path))
        again = xgrad.enable_compilation_cache({str(tmp_path / "other")!r})  # a configured cache is kept
        print(json.dumps({{"changed": changed, "path": path, "dir": jax.config.jax_compilation_cache_dir,
                           "files": files, "again": again}}))
        """,
        devices=1,
    )
    assert result["changed"] == []
    assert result["path"] == result["dir"] == result["again"] == str(tmp_path)
    assert result["files"] > 0  # JAX looked again after the first compile and wrote the new programs


def test_environment_variable(monkeypatch, tmp_path):
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    assert compile_cache.cache_dir() is None
    for off in ("0", "off", "false", ""):
        monkeypatch.setenv(compile_cache.ENV, off)
        assert compile_cache.cache_dir() is None
    monkeypatch.setenv(compile_cache.ENV, "1")
    assert compile_cache.cache_dir() == compile_cache.default_cache_dir()
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "cache"))
    assert compile_cache.cache_dir() == str(tmp_path / "cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.default_cache_dir() == os.path.join(str(tmp_path), "xgrad", "jax")

"""The package a user installs: the wheel that `pip wheel .` builds from a clone's files,
installed into a fresh venv and used from a folder outside the checkout.

A fresh venv that installs the ~250 locked packages takes minutes, so it gets them another
way: the wheel goes in with --no-deps, and a .pth file puts the checkout venv's
site-packages on its path. A path line in a .pth file is added to sys.path, but the .pth
files inside that folder are not run, so the checkout's editable install (a finder that
such a file installs) stays out: `explorer` must import from the fresh venv, and the test
checks that it does. The kernels build into a fresh kvscope cache folder (the converted
default model is linked in), so "native kernels on" means gcc compiled the C source the
wheel carries."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from benchmarks.lab_harness import isolated_jupyter_env
from explorer.apps import lab

REPO = Path(__file__).resolve().parents[2]


def clone_files(dest: Path) -> Path:
    """The files a fresh clone has (tracked, and new ones git does not ignore), copied into
    `dest`; symlinks stay symlinks, as git checks them out."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout (the wheel is built from the files a clone has)")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src, dst = REPO / rel, dest / rel
        if not src.is_symlink() and not src.exists():  # deleted in the working tree, not yet committed
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, dst)
    return dest


def run(argv: list, env: dict, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    out = subprocess.run([str(a) for a in argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{argv} exited with {out.returncode}:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip wheel .` builds from a clone's files."""
    root = tmp_path_factory.mktemp("wheel")
    src = clone_files(root / "clone")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", src, "-w", root / "dist"],
        dict(os.environ), src)
    (built,) = (root / "dist").glob("kvscope-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory, default_model_path):
    """(python of a fresh venv with the wheel installed, its environment, a folder outside the
    checkout to work in)."""
    root = tmp_path_factory.mktemp("installed")
    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], dict(os.environ), root)
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel], dict(os.environ), root)
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    dict(os.environ), root).stdout.strip())
    locked = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "kvscope-test-locked-deps.pth").write_text("".join(f"{p}\n" for p in sorted(locked)))

    cache = root / "cache"  # fresh: the kernels compile here; the converted model is linked in
    cache.mkdir()
    (cache / default_model_path.name).symlink_to(default_model_path)
    env = isolated_jupyter_env(root / "jupyter-home")
    for name in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
        env.pop(name, None)
    env.update(KVSCOPE_CACHE_DIR=str(cache), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               # the locked packages' share/ half (JupyterLab's extensions, the widgets' front-ends)
               JUPYTER_PATH=str(Path(sys.prefix) / "share" / "jupyter"))
    work = root / "work"
    work.mkdir()
    return python, env, work


@pytest.mark.slow
def test_the_wheel_carries_the_kernel_source_and_every_notebook(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "engine/cpu_kernels/kvscope_cpu.c" in names
    notebooks = {p.name for p in (REPO / "notebooks").glob("*.ipynb")}
    assert lab.NOTEBOOK in notebooks
    assert {n.rsplit("/", 1)[1] for n in names if n.startswith("explorer/apps/notebooks/")} == notebooks


@pytest.mark.slow
def test_an_installed_kvscope_builds_its_kernels_steps_the_engine_and_opens_the_walkthrough(installed):
    python, env, work = installed
    # -- the installed copy is the one imported, from outside the checkout ---------------------
    where = json.loads(run([python, "-c", "import json, sys, engine, explorer, widgets, engine.cpu_kernels as k; "
                                          "print(json.dumps([engine.__file__, explorer.__file__, widgets.__file__, "
                                          "str(k.SOURCE), sys.path]))"], env, work).stdout)
    site = str(python.parents[1])
    assert all(path.startswith(site) for path in where[:4]), where
    assert not any(p and Path(p).resolve() == REPO for p in where[4]), where[4]

    # -- doctor: everything required present, the native kernels built -----------------------
    report = run([python, "-m", "explorer", "doctor"], env, work).stdout
    kernels = re.search(r"^ok\s+native CPU kernels\s+(\w+) build: (\S+) \(built from (\S+)\)", report, re.M)
    assert kernels, report
    assert Path(kernels.group(2)).is_file() and kernels.group(2).startswith(env["KVSCOPE_CACHE_DIR"]), report
    assert kernels.group(3).startswith(site), report
    assert re.search(r"^ok\s+walkthrough\s+\S+walkthrough\.ipynb \(installed", report, re.M), report

    # -- a few engine steps with the default model, on the native kernels ---------------------
    steps = json.loads(run([python, "-c", """if True:
        import json
        from engine import LLM, SamplingParams
        eng = LLM().engine
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        rid = eng.add_request("The capital of France is", params)
        records = [eng.step() for _ in range(4)]
        print(json.dumps({"backend": eng.runner.backend.name, "tokens": eng.requests[rid].output_token_ids,
                          "finished": [list(r.finished) for r in records]}))"""], env, work).stdout.splitlines()[-1])
    assert steps["backend"] == "cpu", steps  # the attention backend of the native kernels
    assert len(steps["tokens"]) == 4 and steps["finished"][-1], steps

    # -- lab: the walkthrough copied into a working folder it names, served over HTTP -----------
    log_path = work / "lab.log"
    with open(log_path, "w") as log:  # a file, not a pipe: an unread pipe would block the server
        proc = subprocess.Popen([str(python), "-m", "explorer", "lab", "--no-browser", "--port", "8888"], env=env,
                                cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "[kvscope] open: " not in (banner := log_path.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, banner
            time.sleep(0.2)
        folder = work / lab.WORKING_FOLDER
        assert f"[kvscope] working folder: {folder.resolve()}" in banner, banner
        assert (folder / lab.NOTEBOOK).read_bytes() == (REPO / "notebooks" / lab.NOTEBOOK).read_bytes()
        url = banner.split("[kvscope] open: ", 1)[1].split()[0]
        match = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/lab/tree/walkthrough\.ipynb\?token=([0-9a-f]+)", url)
        assert match, url
        contents = f"http://127.0.0.1:{match.group(1)}/api/contents/{lab.NOTEBOOK}?content=0&token={match.group(2)}"
        while True:
            assert proc.poll() is None, log_path.read_text()
            try:
                with urllib.request.urlopen(contents, timeout=2) as resp:
                    assert json.load(resp)["type"] == "notebook"  # the served folder is the working folder
                    break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "JupyterLab did not answer:\n" + log_path.read_text()
                time.sleep(0.25)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def test_lab_keeps_the_notebooks_a_user_has_in_the_working_folder(tmp_path):
    """copy_notebooks never overwrites: a second `explorer lab` finds the user's edits."""
    dest = tmp_path / lab.WORKING_FOLDER
    copied, kept = lab.copy_notebooks(dest)
    assert lab.NOTEBOOK in copied and kept == []
    (dest / lab.NOTEBOOK).write_text("{}  the user's edits")
    (dest / "attach.ipynb").unlink()
    copied, kept = lab.copy_notebooks(dest)
    assert copied == ["attach.ipynb"] and lab.NOTEBOOK in kept
    assert (dest / lab.NOTEBOOK).read_text() == "{}  the user's edits"


def test_in_a_checkout_lab_serves_the_repository_notebooks_in_place():
    assert lab.in_checkout()
    assert lab.notebooks_root(None) == REPO / "notebooks"
    assert lab.packaged_notebooks_dir().resolve() == (REPO / "notebooks").resolve()  # one copy in git

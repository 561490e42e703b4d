"""The package builds offline as a wheel that carries both packages, and
bench.py runs and prints its table (a short run)."""
import os
import shutil
import subprocess
import sys
import zipfile

from spawn import PY_ROOT, free_ports, library_path


def test_wheel_builds_offline_with_both_packages(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(PY_ROOT, src, ignore=shutil.ignore_patterns("tests", "__pycache__", "build",
                                                               "*.egg-info"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-index", "--no-deps",
                        "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    wheels = list((tmp_path / "dist").glob("moe_ep-*.whl"))
    assert len(wheels) == 1, os.listdir(tmp_path / "dist")
    names = zipfile.ZipFile(wheels[0]).namelist()
    for f in ("moe_ep/__init__.py", "moe_ep/group.py", "moe_ep/deep_ep/__init__.py",
              "moe_ep/deep_ep/buffer.py"):
        assert f in names, names


def test_bench_prints_its_table():
    env = dict(os.environ, MOE_EP_LIBRARY=library_path(), MOE_EP_RANK="0", MOE_EP_WORLD_SIZE="1")
    r = subprocess.run([sys.executable, os.path.join(PY_ROOT, "bench.py"), "--iters", "20",
                        "--tokens", "16", "--hidden", "128", "--experts", "8",
                        "--address", "127.0.0.1:%d" % free_ports(1)[0]],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for row in ("dispatch out=", "combine out=", "dispatch stub", "ctypes call floor"):
        assert row in r.stdout, r.stdout

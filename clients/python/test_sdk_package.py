"""The package itself: its stubs are proto/'s, it builds from a clean tree
(`python -m build`: an sdist, then a wheel from that sdist), and the wheel
installs offline into a fresh virtualenv where the SDK example runs."""

import filecmp
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
import venv
import zipfile
from pathlib import Path

import toolgate
import toolgate.v1

from conftest import required

HERE = Path(__file__).resolve().parent


def test_the_stubs_in_the_package_are_generated_from_proto(repo, tmp_path):
    from grpc_tools import protoc
    import importlib.resources

    protos = sorted((repo / "proto" / "toolgate" / "v1").glob("*.proto"))
    assert protos
    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    assert protoc.main(["protoc", f"-I{repo / 'proto'}", f"-I{well_known}", f"--python_out={tmp_path}",
                        f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", *map(str, protos)]) == 0
    fresh = tmp_path / "toolgate" / "v1"
    installed = Path(toolgate.v1.__path__[0])
    generated = sorted(p.name for p in fresh.iterdir())
    assert len(generated) == 3 * len(protos)
    shipped = sorted(p.name for p in installed.iterdir() if p.name != "__init__.py" and p.suffix in (".py", ".pyi"))
    assert shipped == generated
    _, mismatch, errors = filecmp.cmpfiles(fresh, installed, generated, shallow=False)
    assert (mismatch, errors) == ([], [])


def clean_tree(repo, into):
    """clients/python and proto/ as a clone has them: no build output, no caches."""
    skip = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")
    shutil.copytree(repo / "clients" / "python", into / "clients" / "python", ignore=skip)
    shutil.copytree(repo / "proto", into / "proto", ignore=skip)
    return into / "clients" / "python"


def test_the_package_builds_from_a_clean_tree_and_runs_in_a_fresh_virtualenv(repo, addr, tmp_path):
    source = clean_tree(repo, tmp_path / "clone")
    dist = tmp_path / "dist"
    # The build dependencies are the pinned ones scripts/test.sh installed: no registry.
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    assert sorted(p.name for p in dist.iterdir()) == ["toolgate-0.1.0-py3-none-any.whl", "toolgate-0.1.0.tar.gz"]
    with tarfile.open(dist / "toolgate-0.1.0.tar.gz") as sdist:
        names = sdist.getnames()
    assert "toolgate-0.1.0/proto/toolgate/v1/authorization.proto" in names
    assert not [n for n in names if n.endswith("_pb2.py")]  # generated at build time, never shipped as source
    with zipfile.ZipFile(dist / "toolgate-0.1.0-py3-none-any.whl") as wheel:
        files = set(wheel.namelist())
    for name in ("toolgate/py.typed", "toolgate/v1/authorization_pb2.py", "toolgate/v1/authorization_pb2.pyi",
                 "toolgate/v1/ledger_pb2_grpc.py", "toolgate/adapters/langchain.py"):
        assert name in files, sorted(files)

    fresh = tmp_path / "fresh"
    venv.create(fresh, with_pip=True)
    python = fresh / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
         "--find-links", required("TOOLGATE_WHEELHOUSE"), str(dist / "toolgate-0.1.0-py3-none-any.whl")],
        capture_output=True, text=True, env=env, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    # The example, alone in a folder: it can only import the installed package.
    run_dir = tmp_path / "example"
    run_dir.mkdir()
    shutil.copy(HERE / "sdk_example.py", run_dir)
    request_id = f"fresh-venv-{uuid.uuid4()}"

    def example():
        out = subprocess.run([str(python), "sdk_example.py", "2500", request_id], cwd=run_dir,
                             capture_output=True, text=True, env={**env, "TOOLGATE_ADDR": addr}, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    where = subprocess.run([str(python), "-c", "import toolgate; print(toolgate.__file__)"], cwd=run_dir,
                           capture_output=True, text=True, env=env)
    assert where.stdout.startswith(str(fresh)), where.stdout + where.stderr
    assert example() == 'succeeded {"amount_cents":2500,"refund_id":"re_1"}\n'
    # A second process, the same operation: the stored result, not a second refund.
    assert example() == 'completed {"amount_cents":2500,"refund_id":"re_1"}\n'


def test_the_installed_package_type_checks(tmp_path):
    """The package says it is typed (py.typed): mypy agrees, with its generated stubs' .pyi."""
    installed = Path(toolgate.__path__[0]).parent
    # The frameworks are not what is checked here (and take minutes): their
    # names are taken as given.
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\nignore_missing_imports = True\n"
                      "[mypy-agents.*,langchain_core.*,openai.*,pydantic.*]\nfollow_imports = skip\n")
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), "--cache-dir", str(tmp_path / "cache"),
         "-p", "toolgate"], capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "MYPYPATH": str(installed)})
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.startswith("Success: no issues found"), checked.stdout

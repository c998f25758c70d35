"""The build hook: generates toolgate.v1 (messages, type stubs and gRPC
stubs) from proto/toolgate/v1 with the pinned grpcio-tools, into the build
tree; the source tree holds no generated code.

The .proto files are read from `proto/` beside this file (an sdist carries
them there) or else from the repository's `proto/` two levels up.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent


def proto_root() -> Path:
    for candidate in (HERE / "proto", HERE.parent.parent / "proto"):
        if (candidate / "toolgate" / "v1").is_dir():
            return candidate
    raise SystemExit("toolgate: proto/toolgate/v1 is neither in this package nor in the repository around it")


def protos(root: Path) -> list:
    return sorted((root / "toolgate" / "v1").glob("*.proto"))


def generate(out_dir: Path) -> None:
    import importlib.resources

    from grpc_tools import protoc

    root = proto_root()
    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    args = ["grpc_tools.protoc", f"-I{root}", f"-I{well_known}", f"--python_out={out_dir}",
            f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}", *map(str, protos(root))]
    if protoc.main(args) != 0:
        raise SystemExit("toolgate: protoc failed on proto/toolgate/v1")


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        if not self.dry_run:
            generate(Path(self.build_lib))


class SdistWithProtos(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = proto_root()
        target = Path(base_dir, "proto", "toolgate", "v1")
        target.mkdir(parents=True, exist_ok=True)
        for proto in protos(root):
            shutil.copyfile(proto, target / proto.name)


setup(cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProtos})

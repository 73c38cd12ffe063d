"""Python stubs of proto/sluice/v1, generated once per test process with grpcio-tools (pinned in
tests/requirements.txt). Afterwards every sluice.v1 module imports by name; `modules(name)` gives
a service's (messages, stubs) pair. `pb`, `pb_grpc`: sluice.v1.inference; `common`:
sluice.v1.common."""

import importlib
import pathlib
import sys
import tempfile

from grpc_tools import protoc

REPO = pathlib.Path(__file__).resolve().parents[2]


def _generate():
    out = tempfile.mkdtemp(prefix="sluice-grpc-stubs-")
    proto_root = REPO / "proto"
    protos = sorted(str(p.relative_to(proto_root))
                    for p in (proto_root / "sluice" / "v1").glob("*.proto"))
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    assert protoc.main(["protoc", f"-I{proto_root}", f"-I{include}", f"--python_out={out}",
                        f"--grpc_python_out={out}", *protos]) == 0, "protoc failed"
    sys.path.insert(0, out)


def modules(name):
    """(sluice.v1.<name>_pb2, sluice.v1.<name>_pb2_grpc), e.g. modules("worker")."""
    return (importlib.import_module(f"sluice.v1.{name}_pb2"),
            importlib.import_module(f"sluice.v1.{name}_pb2_grpc"))


_generate()
pb, pb_grpc = modules("inference")
common = importlib.import_module("sluice.v1.common_pb2")

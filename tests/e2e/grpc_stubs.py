"""Python stubs of proto/sluice/v1, generated at import time with grpcio-tools."""

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
    return (importlib.import_module("sluice.v1.inference_pb2"),
            importlib.import_module("sluice.v1.inference_pb2_grpc"))


pb, pb_grpc = _generate()

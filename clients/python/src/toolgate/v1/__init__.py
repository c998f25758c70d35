"""The toolgate.v1 gRPC messages and stubs (authorization_pb2, ledger_pb2,
approval_pb2, common_pb2 and their *_pb2_grpc), generated from
proto/toolgate/v1 when the package is built (setup.py)."""

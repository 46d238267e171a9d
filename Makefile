# Developer shortcuts. The generated protobuf modules are committed; CI checks they are fresh.
.PHONY: proto proto-check

# Regenerate accord/proto/*_pb2*.py(i) from accord/proto/*.proto.
proto:
	rm -f accord/proto/*_pb2.py accord/proto/*_pb2.pyi accord/proto/*_pb2_grpc.py
	scripts/gen-proto

# Fail when the committed generated modules differ from what the .proto files produce.
proto-check:
	scripts/check-proto

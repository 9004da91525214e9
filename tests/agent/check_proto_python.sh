#!/bin/bash
# Regenerates python/rayfabric/agent_pb2.py from proto/rayfabric/v1/agent.proto and fails if the
# checked-in copy differs (someone changed the proto and forgot to regenerate it).
set -euo pipefail
protoc=$1 root=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$protoc" --proto_path="$root/proto/rayfabric/v1" --python_out="$out" "$root/proto/rayfabric/v1/agent.proto"
if ! diff -q "$out/agent_pb2.py" "$root/python/rayfabric/agent_pb2.py" >/dev/null; then
  echo "python/rayfabric/agent_pb2.py is stale; regenerate it:"
  echo "  protoc --proto_path=proto/rayfabric/v1 --python_out=python/rayfabric proto/rayfabric/v1/agent.proto"
  exit 1
fi
echo "agent_pb2.py matches agent.proto"

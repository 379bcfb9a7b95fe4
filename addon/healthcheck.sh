#!/bin/bash
# The image's HEALTHCHECK: passes when the Wyoming server on PORT (10800) is this program,
# i.e. it answers `describe` with an info whose services are pivoice's. Any other Wyoming
# server (or a port that some other program holds) fails it.
#   healthcheck.sh [PORT]
set -euo pipefail
port="${1:-10800}"
exec 3<> "/dev/tcp/127.0.0.1/${port}"
printf '{"type": "describe"}\n' >&3
# A Wyoming event: a JSON header line, then data_length bytes of JSON data.
IFS= read -r -t 5 header <&3
[[ "${header}" =~ \"type\":\ *\"info\" ]] || exit 1
data=""
if [[ "${header}" =~ \"data_length\":\ *([0-9]+) ]]; then
    data=$(timeout 5 head -c "${BASH_REMATCH[1]}" <&3)
fi
[[ "${header}${data}" =~ \"name\":\ *\"pivoice-(faster-whisper|piper|llama)\" ]]

#!/bin/sh
# Builds the pivoice_aec3 wheel (AEC3 with its linear output) into native/aec3/dist/:
# downloads rhasspy's webrtc-noise-gain 1.3.0 sdist from PyPI (it bundles the
# webrtc-audio-processing 1.3 source), checks its hash, unpacks it under build/, and
# compiles it with our binding (setup.py). Needs a C++17 compiler and Python headers;
# pip fetches setuptools and pybind11 for the build. Install: pip install native/aec3/dist/*.whl
set -eu
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
version=1.3.0
sha256=67c96337db3b074a7a5dce0936c98a93886f22a0724e4387198ae86f31914643
cache=$here/build/sdist
sdist=$cache/webrtc_noise_gain-$version.tar.gz
mkdir -p "$cache"
if [ ! -f "$sdist" ]; then
    "$python" -m pip download --no-deps --no-binary :all: -d "$cache" "webrtc-noise-gain==$version"
fi
echo "$sha256  $sdist" | sha256sum -c -
src=$cache/webrtc_noise_gain-$version
[ -d "$src" ] || tar -xzf "$sdist" -C "$cache"
PIVOICE_WEBRTC_SRC=$src "$python" -m pip wheel --no-deps -w "$here/dist" "$here"

#!/usr/bin/env bash
# Packs the Python packages dicosa needs that the lent GPU machine's image lacks into
# .devsite/site.tar.xz (ignored by git), for benchmarks/gpu_session.sh to unpack there.
#
#   bash benchmarks/gpu_site.sh [PYTHON]      # PYTHON: the venv whose versions to take
#
# That machine runs Python 3.12 with its own torch, numpy, pandas, scipy, accelerate, timm,
# opencv and more (the device tool's KINDS.md lists them) and reaches no registry. The wheels
# are fetched here for CPython 3.12 at the versions installed in PYTHON's environment, so the
# GPU runs the code this machine tests. imageio-ffmpeg travels without its 170 MB ffmpeg (a
# call carries at most 64 MiB): gpu_session.sh uses the machine's ffmpeg if it has one.
# xz, not the wheels' zip, keeps the whole under ~50 MB.
set -euo pipefail
python=${1:-.venv/bin/python}
packages="open_clip_torch ftfy wcwidth decord av simplejpeg faiss-cpu scenedetect pysubs2
  platformdirs fastapi starlette uvicorn pydantic pydantic_core annotated-types annotated-doc
  typing-inspection typing_extensions opentelemetry-api swagger-ui-bundle-v2 imageio-ffmpeg"
wheels=$(mktemp -d)
site=$(mktemp -d)
trap 'rm -rf "$wheels" "$site"' EXIT
for name in $packages; do
    version=$("$python" -m pip show "$name" | sed -n 's/^Version: //p')
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux2010_x86_64 -d "$wheels" "$name==$version"
done
for wheel in "$wheels"/*.whl; do unzip -q -o "$wheel" -d "$site"; done
rm -f "$site"/imageio_ffmpeg/binaries/ffmpeg-*
mkdir -p .devsite
tar cf - -C "$site" . | xz -T0 -9 >.devsite/site.tar.xz
ls -l .devsite/site.tar.xz

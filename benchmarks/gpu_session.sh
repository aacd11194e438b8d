#!/usr/bin/env bash
# What a lent GPU machine measures, in one call (benchmarks/RESULTS.md, "GPU"):
#
#   bash benchmarks/gpu_session.sh OUT_DIR [STEP...]        # on the GPU machine, repo root
#   bash benchmarks/gpu_session.sh OUT_DIR --smoke [STEP...] # smoke sizes, on a CPU
#   SERVE_ARGS="--threads 4" bash benchmarks/gpu_session.sh OUT_DIR serve
#
# 1. demo: the README's main job end to end (`python -m dicosa demo`: synthetic data,
#    train.py's training, evaluation, figure, index, search) on CUDA;
# 2. serve: the search service on CUDA (text tower and rerank on the GPU, one process),
#    100,000 videos with int8 frames, 8 clients (benchmarks/serve.py --device cuda);
# 3. train_epoch: the whole training loop at ViT-B/32 size, the DataLoader's workers on the
#    machine's cores (benchmarks/train_epoch.py);
# 4. data: the loader alone on MJPEG files, 1 and 16 workers (benchmarks/data.py), where
#    the machine has an ffmpeg to write them.
#
# STEPs: any of demo, serve, train_epoch, data (default: all four, in this order). Each
# step runs under its own time limit, so one that fails or hangs costs only itself. The logs
# go to OUT_DIR/log.txt, each step's JSON to OUT_DIR/<step>.json, one line per step to
# OUT_DIR/summary.txt; the script exits 1 if any step failed. The GPU machine has no
# registry: the Python packages it lacks travel as .devsite/site.tar.xz (benchmarks/
# gpu_site.sh makes it), unpacked there to /tmp/site.
set -u
out=${1:?usage: gpu_session.sh OUT_DIR [--smoke] [STEP...]}
shift
smoke=
[ "${1:-}" = --smoke ] && smoke=1 && shift
steps=" ${*:-demo serve train_epoch data} "
mkdir -p "$out"
log="$out/log.txt"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PYTHONUNBUFFERED=1

site=${GPU_SITE-.devsite/site.tar.xz}  # GPU_SITE= (empty): use the installed packages
if [ -n "$site" ] && [ -f "$site" ]; then
    mkdir -p /tmp/site && tar xJf "$site" -C /tmp/site
    export PYTHONPATH="/tmp/site:$PWD"
fi
ffmpeg_exe=$(command -v ffmpeg || true)
[ -n "$ffmpeg_exe" ] && export IMAGEIO_FFMPEG_EXE="$ffmpeg_exe"

step() {  # step NAME SECONDS COMMAND...: run COMMAND under a limit, log it, one summary line
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    [ "$name" = env ] || [[ "$steps" == *" $name "* ]] || return 0
    echo "=== $name: $*" >>"$log"
    timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
    rc=$?
    echo "$name: exit $rc after $((SECONDS - start)) s (limit $limit s)" | tee -a "$log" "$out/summary.txt"
    [ "$rc" = 0 ] || failed=1
}
failed=0

step env 60 python3 -c "
import os, platform, shutil, torch
print('python', platform.python_version(), 'torch', torch.__version__, 'cores', os.cpu_count())
print('cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))
print('ffmpeg', shutil.which('ffmpeg'))
import av, decord, faiss, fastapi, open_clip, simplejpeg, uvicorn, dicosa
print('dicosa', dicosa.__version__, 'faiss', faiss.__version__, 'av', av.__version__)
"

if [ -n "$smoke" ]; then
    step demo 240 python3 -m dicosa demo --quick --out "$work/demo"
    step serve 240 python3 benchmarks/serve.py --smoke --device cpu --out "$out/serve.json"
    step train_epoch 240 python3 benchmarks/train_epoch.py --smoke --out "$out/train_epoch.json"
    if [ -n "$ffmpeg_exe" ]; then
        step data 240 python3 benchmarks/data.py --smoke --out "$out/data.json"
    fi
else
    step demo 150 python3 -m dicosa demo --out "$work/demo"
    # shellcheck disable=SC2086  # SERVE_ARGS: extra options, split on purpose
    step serve 200 python3 benchmarks/serve.py --videos 100000 --device cuda --frame-dtype int8 \
        --max-batch 8 --seconds 20 --warmup 5 --single-seconds 10 --work "$work/serve" \
        --out "$out/serve.json" ${SERVE_ARGS:-}
    step train_epoch 120 python3 benchmarks/train_epoch.py --arch ViT-B-32 --device cuda \
        --batch 128 --frames 12 --workers 12 --steps 30 --out "$out/train_epoch.json"
    if [ -n "$ffmpeg_exe" ]; then
        step data 60 python3 benchmarks/data.py --workers 1 16 --out "$out/data.json"
    fi
fi
if [ -f "$work/demo/metrics.json" ]; then cp "$work/demo/metrics.json" "$out/demo_metrics.json"; fi
exit "$failed"  # 1 if any step failed or ran out of time

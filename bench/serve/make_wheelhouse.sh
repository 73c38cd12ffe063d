#!/usr/bin/env bash
# Downloads the serving benchmark's pinned Python packages (bench/serve/requirements.txt: aiperf
# and what it needs) as wheels for a machine without network, e.g. the GPU machine, whose Python
# differs from this one's. bench/serve_bench.sh installs from the folder when
# SLUICE_WHEELHOUSE names it (offline, in a venv that also sees that machine's own packages).
#
#   bench/serve/make_wheelhouse.sh DIR [--python-version 3.12] [--skip NAME ...] [--part-mib N]
#
# --skip leaves out packages the target machine already has (a PyTorch image has numpy, pandas,
# transformers, ...): a wheelhouse has to fit what one device call carries. pip then takes the
# target's installed copy, so it must satisfy aiperf's version bounds there. --part-mib N spreads
# the wheels over DIR/part1, DIR/part2, ... of at most N MiB each (a device call carries 64 MiB:
# carry one part per call; earlier parts stay on a warm machine). Prints the sizes.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { sed -n 2,11p "$0"; exit 2; }
dir="$1"; shift
pyver=3.12
skip=()
part_mib=0
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) pyver="$2"; shift 2 ;;
    --skip) skip+=("$2"); shift 2 ;;
    --part-mib) part_mib="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
mkdir -p "$dir"
"$py" -m pip download -q -r bench/serve/requirements.txt -d "$dir" --only-binary=:all: \
  --python-version "$pyver" --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any
for name in "${skip[@]}"; do
  # Wheel names normalise '-' to '_' (PEP 427).
  rm -f "$dir/${name//-/_}"-[0-9]*.whl "$dir/${name}"-[0-9]*.whl
done
cp bench/serve/requirements.txt "$dir/"
if [ "$part_mib" -gt 0 ]; then
  # First fit, largest wheels first.
  part=1; used=0; limit=$((part_mib * 1024 * 1024))
  while read -r size file; do
    [ "$size" -le "$limit" ] || { echo "$file alone is over $part_mib MiB" >&2; exit 1; }
    if [ $((used + size)) -gt "$limit" ]; then part=$((part + 1)); used=0; fi
    mkdir -p "$dir/part$part"
    mv "$dir/$file" "$dir/part$part/"
    used=$((used + size))
  done < <(cd "$dir" && find . -maxdepth 1 -name '*.whl' -printf '%s %f\n' | sort -rn)
  du -sh "$dir"/part*
else
  du -sh "$dir"
fi

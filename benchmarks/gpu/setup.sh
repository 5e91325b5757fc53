# Sourced at the start of every device call: the service's pure-Python and cp312 deps over the image's torch.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/tmp/pip.log 2>&1 || { tail -20 /tmp/pip.log; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
BIN=$(dirname "$(python3 -c 'import sys;print(sys.executable)')")
[ -x "$BIN/jina" ] || cp /tmp/site/bin/jina "$BIN/jina"
PY=python3 bash benchmarks/gpu/patch312.sh /tmp/site >/tmp/patch.log 2>&1 || { cat /tmp/patch.log; exit 1; }

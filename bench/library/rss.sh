#!/usr/bin/env bash
# The appliance's RSS with the library on and off (docs/benchmarks/library.md, "Memory"):
# started, one chat; with the library, the evaluation set's documents added and indexed,
# 16 embeddings of 256 tokens and a chat with "library": true.
#   bench/library/rss.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
for lib in true false; do
  rm -rf /tmp/rss-state; .venv/bin/appliance serve --host 127.0.0.1 --port 18411 --log-level warning --state-dir /tmp/rss-state --library $lib > /tmp/rss-$lib.log 2>&1 &
  p=$!
  for _ in $(seq 1 120); do curl -sf http://127.0.0.1:18411/health >/dev/null && break; sleep 1; done
  s0=$(awk '/VmRSS/ {print int($2/1024)}' /proc/$p/status)
  curl -s http://127.0.0.1:18411/v1/chat/completions -H 'Content-Type: application/json' -d '{"messages":[{"role":"user","content":"Say hi."}],"max_tokens":8}' >/dev/null
  if [ $lib = true ]; then
    .venv/bin/python -c "
import httpx,json,time
c=httpx.Client(base_url='http://127.0.0.1:18411',timeout=300)
d=json.load(open('bench/library/eval/set.json'))
for doc in d['documents']:
    c.post('/admin/library',content='\f'.join(doc['pages']).encode(),headers={'content-type':'text/plain','x-file-name':doc['id']+'.txt'})
while any(x['status']=='indexing' for x in c.get('/admin/library').json()['data']): time.sleep(0.5)
c.post('/v1/embeddings',json={'input':['word '*300]*16})
c.post('/v1/chat/completions',json={'messages':[{'role':'user','content':'Where do we gather if the fire alarm goes off?'}],'max_tokens':8,'library':True})
"
  fi
  s1=$(awk '/VmRSS/ {print int($2/1024)}' /proc/$p/status); h=$(awk '/VmHWM/ {print int($2/1024)}' /proc/$p/status)
  echo "library=$lib: RSS at start ${s0} MiB, after use ${s1} MiB, peak ${h} MiB"
  kill $p; wait $p 2>/dev/null || true
done

import time
from pathlib import Path
from appliance.llm import LLM, ContextSpec
m = LLM(Path("models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), ContextSpec(n_ctx=4096, n_seq_max=2, n_batch=512, threads=2, repack=False))
toks = m.tokenizer.tokenize("hello world " * 150)[:300]
m.decode(toks, list(range(300)), [0]*300, [False]*299+[True])
for rows in (1, 2, 4, 8, 16):
    for logits_all in (True, False):
        ts=[]
        for rep in range(6):
            t0=time.perf_counter()
            m.decode(toks[:rows], list(range(300, 300+rows)), [0]*rows, [logits_all]*(rows-1)+[True])
            ts.append(time.perf_counter()-t0)
            m.seq_rm(0, 300, -1)
        ts.sort()
        print(rows, "all-logits" if logits_all else "last-logit", f"{1000*ts[len(ts)//2]:.1f} ms")

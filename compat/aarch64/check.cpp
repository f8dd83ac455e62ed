// Greedy generation and teacher-forced top-5 check against llama.cpp's C API, built for
// x86-64 and aarch64 by compat/aarch64-check.sh (the same source, the same llama.cpp).
//
//   check gen   MODEL THREADS N_GEN PROMPT_FILE  -> prints the prompt's and the greedy tokens
//   check force MODEL THREADS TOKENS_FILE        -> decodes the reference run's tokens in one
//       batch and, at every generated step, prints where the reference token ranks in this
//       run's logits ("step i token t rank r top5 a,b,c,d,e"), then a summary line.
//
// A "tokens file" is gen's output: line 1 "prompt N", line 2 the N+N_GEN token ids.
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static void quiet(ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

struct Run {
    llama_model * model = nullptr;
    llama_context * ctx = nullptr;
    const llama_vocab * vocab = nullptr;
    int n_vocab = 0;
};

static Run open_model(const char * path, int threads, int n_ctx) {
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    Run r;
    llama_model_params mp = llama_model_default_params();
    // APPLIANCE_NO_REPACK=1: no extra buffer types (this x86 VM advertises AMX its kernel
    // does not enable; llama.cpp's AMX path crashes there). On ARM the repacked kernels stay.
    mp.use_extra_bufts = getenv("APPLIANCE_NO_REPACK") == nullptr;
    double t0 = now_s();
    r.model = llama_model_load_from_file(path, mp);
    if (!r.model) { fprintf(stderr, "cannot load %s\n", path); exit(1); }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ctx;
    cp.n_ubatch = 128;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.no_perf = true;
    r.ctx = llama_init_from_model(r.model, cp);
    if (!r.ctx) { fprintf(stderr, "cannot create a context\n"); exit(1); }
    r.vocab = llama_model_get_vocab(r.model);
    r.n_vocab = llama_vocab_n_tokens(r.vocab);
    fprintf(stderr, "load %.1f s\n", now_s() - t0);
    return r;
}

static void decode(Run & r, const std::vector<llama_token> & toks, int pos0, int logits_from) {
    llama_batch b = llama_batch_init((int) toks.size(), 0, 1);
    for (size_t i = 0; i < toks.size(); i++) {
        b.token[i] = toks[i];
        b.pos[i] = pos0 + (int) i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = (int) i >= logits_from;
    }
    b.n_tokens = (int) toks.size();
    if (llama_decode(r.ctx, b) != 0) { fprintf(stderr, "llama_decode failed\n"); exit(1); }
    llama_batch_free(b);
}

static int argmax(const float * x, int n) {
    return (int) (std::max_element(x, x + n) - x);
}

static std::string piece(Run & r, llama_token t) {
    char buf[256];
    int n = llama_token_to_piece(r.vocab, t, buf, sizeof buf, 0, true);
    return std::string(buf, n > 0 ? n : 0);
}

static int gen(const char * model, int threads, int n_gen, const char * prompt_file) {
    std::ifstream f(prompt_file);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string text = ss.str();
    Run r = open_model(model, threads, 512);
    std::vector<llama_token> toks(text.size() + 16);
    int n = llama_tokenize(r.vocab, text.c_str(), (int) text.size(), toks.data(), (int) toks.size(), false, true);
    toks.resize(n);
    double t0 = now_s();
    decode(r, toks, 0, n - 1);
    double t_prompt = now_s() - t0;
    std::vector<llama_token> out;
    t0 = now_s();
    for (int i = 0; i < n_gen; i++) {
        llama_token t = argmax(llama_get_logits_ith(r.ctx, -1), r.n_vocab);
        out.push_back(t);
        if (i + 1 < n_gen) decode(r, {t}, n + i, 0);
    }
    double t_gen = now_s() - t0;
    printf("prompt %d\n", n);
    for (llama_token t : toks) printf("%d ", t);
    for (llama_token t : out) printf("%d ", t);
    printf("\n");
    std::string s;
    for (llama_token t : out) s += piece(r, t);
    fprintf(stderr, "prompt %d tokens in %.1f s (%.1f tok/s), %d greedy tokens in %.1f s (%.2f tok/s)\n",
            n, t_prompt, n / t_prompt, n_gen, t_gen, n_gen / t_gen);
    fprintf(stderr, "text: %s\n", s.c_str());
    return 0;
}

static int force(const char * model, int threads, const char * tokens_file) {
    std::ifstream f(tokens_file);
    std::string word;
    int n_prompt = 0;
    f >> word >> n_prompt;
    std::vector<llama_token> toks;
    for (int t; f >> t;) toks.push_back(t);
    Run r = open_model(model, threads, 512);
    double t0 = now_s();
    // Rows n_prompt-1 .. end-1 predict the reference's generated tokens n_prompt .. end.
    decode(r, toks, 0, n_prompt - 1);
    fprintf(stderr, "teacher-forced %zu tokens in %.1f s\n", toks.size(), now_s() - t0);
    int steps = 0, top1 = 0, top5 = 0, worst = 0;
    for (size_t i = n_prompt; i < toks.size(); i++) {
        const float * lg = llama_get_logits_ith(r.ctx, (int) i - 1);
        std::vector<int> idx(r.n_vocab);
        for (int k = 0; k < r.n_vocab; k++) idx[k] = k;
        std::partial_sort(idx.begin(), idx.begin() + 5, idx.end(), [&](int a, int b) { return lg[a] > lg[b]; });
        int rank = 1;
        for (int k = 0; k < r.n_vocab; k++) rank += lg[k] > lg[toks[i]];
        printf("step %d token %d rank %d top5 %d,%d,%d,%d,%d\n", steps, toks[i], rank, idx[0], idx[1], idx[2], idx[3], idx[4]);
        steps++;
        top1 += rank == 1;
        top5 += rank <= 5;
        worst = std::max(worst, rank);
    }
    printf("summary steps %d top1 %d top5 %d worst_rank %d\n", steps, top1, top5, worst);
    return top5 == steps ? 0 : 3;
}

int main(int argc, char ** argv) {
    if (argc == 6 && !strcmp(argv[1], "gen")) return gen(argv[2], atoi(argv[3]), atoi(argv[4]), argv[5]);
    if (argc == 5 && !strcmp(argv[1], "force")) return force(argv[2], atoi(argv[3]), argv[4]);
    fprintf(stderr, "usage: check gen MODEL THREADS N_GEN PROMPT_FILE | check force MODEL THREADS TOKENS_FILE\n");
    return 2;
}

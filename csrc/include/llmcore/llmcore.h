/*
 * llmcore.h -- the one public header of the llmcore inference core.
 *
 * llmcore implements the paged-KV bookkeeping (block pool with prefix
 * caching), the KV store, paged attention and token sampling of an LLM
 * inference engine. It is plain C ABI: any host (C, C++, Rust, Go, Python)
 * links libllmcore.so and calls these functions; no Python is needed.
 *
 * Conventions
 *   - Every function that can fail returns lc_status: 0 on success, a
 *     negative LC_ERR_* code on failure. lc_last_error() then returns a
 *     human-readable message for the calling thread.
 *   - Handles are opaque; the function that creates one states who frees it.
 *   - Pointers passed in are BORROWED for the duration of the call unless
 *     the function says otherwise. Output buffers are allocated by the
 *     caller.
 *   - Tensors are described by lc_tensor (data pointer, dtype, device,
 *     shape and strides in elements). The core never allocates or frees
 *     tensor memory it was handed.
 *   - Index arrays (block tables, token lists, offsets) live in host memory,
 *     also for CUDA calls: the core uploads what a kernel needs.
 *   - CUDA calls take the stream explicitly (a cudaStream_t passed as void*;
 *     NULL means the legacy default stream). CPU calls ignore it.
 *
 * KV cache layout (one layer, K and V are separate tensors):
 *
 *     cache[num_blocks][num_kv_heads][block_size][head_size]
 *
 *   token t of a sequence lives in block block_table[t / block_size] at
 *   offset t % block_size; its "slot" is block_id * block_size + offset.
 *
 * Usage example (one decode step for two sequences, one layer):
 *
 *     lc_block_pool* pool;
 *     lc_block_pool_create(1024, 16, &pool);           // caller destroys
 *     int32_t blocks[2];
 *     lc_block_pool_allocate(pool, 2, blocks);          // one block each
 *
 *     int32_t query_start[3] = {0, 1, 2};               // one new token each
 *     int32_t seq_lens[2] = {5, 9};                     // context incl. new token
 *     int32_t block_table[2] = {blocks[0], blocks[1]};  // [2][1]
 *     int64_t slots[2] = {blocks[0] * 16 + 4, blocks[1] * 16 + 8};
 *     lc_attn_metadata md = {2, 2, query_start, seq_lens, block_table, 1, slots};
 *     lc_attn_plan* plan;
 *     lc_attn_plan_create(&md, LC_DEVICE_CPU, 0, NULL, &plan);  // caller destroys
 *
 *     lc_kv_store(plan, &k_new, &v_new, &k_cache, &v_cache, NULL);
 *     lc_attn_params p = {0.125f, 0, 0.0f};
 *     lc_paged_attention(plan, &q, &k_cache, &v_cache, &out, &p, NULL);
 *
 *     lc_sampling_row rows[2] = {...};
 *     lc_sampling_batch batch = {...};
 *     int32_t tokens[2]; float logprobs[2];
 *     lc_sample_output so = {tokens, logprobs, NULL, NULL, NULL};
 *     if (lc_sample(&logits, &batch, NULL, &so) != LC_OK)
 *         fprintf(stderr, "%s\n", lc_last_error());
 *
 *     lc_attn_plan_destroy(plan);
 *     lc_block_pool_free(pool, blocks, 2);
 *     lc_block_pool_destroy(pool);
 */
#ifndef LLMCORE_H
#define LLMCORE_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#if defined(LLMCORE_BUILD)
#define LC_API __declspec(dllexport)
#else
#define LC_API __declspec(dllimport)
#endif
#else
#define LC_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define LC_ABI_VERSION 1

/* ------------------------------------------------------------------ */
/* Status codes and errors                                             */
/* ------------------------------------------------------------------ */

typedef int32_t lc_status;

enum {
    LC_OK = 0,
    LC_ERR_INVALID_ARGUMENT = -1, /* bad shape, dtype, range, id, ... */
    LC_ERR_OUT_OF_BLOCKS = -2,    /* the block pool cannot satisfy an allocation */
    LC_ERR_UNSUPPORTED = -3,      /* valid request the build cannot do (e.g. no CUDA) */
    LC_ERR_OUT_OF_MEMORY = -4,    /* a host or device allocation failed */
    LC_ERR_INTERNAL = -5          /* a bug: an invariant was broken */
};

/* Message for the last failed call on this thread. Never NULL. The string is
 * owned by the library and valid until the next failing call on this thread. */
LC_API const char* lc_last_error(void);

/* Library version string ("major.minor.patch"); static storage. */
LC_API const char* lc_version(void);

/* ABI version this library was built with (LC_ABI_VERSION). */
LC_API int32_t lc_abi_version(void);

/* Build features as a static, comma-separated string: "cpu,scalar" and, on
 * x86-64, the SIMD kernel variants compiled in ("avx2,avx512,amx"), then "cuda"
 * when the CUDA kernels are built, e.g. "cpu,scalar,avx2,avx512,amx,cuda". Which
 * CPU variant runs is chosen at run time: lc_cpu_isa(). */
LC_API const char* lc_build_features(void);

/* The widest CPU kernel variant this CPU runs among those built: "amx" (AVX-512
 * plus the AMX tiles: AMX-TILE/BF16 in CPUID, the tile state in XCR0 and the
 * kernel's permission, which the first call requests for the process), "avx512"
 * (AVX-512 F/BW/VL/DQ), "avx2" (AVX2 + FMA) or "scalar". Static string. */
LC_API const char* lc_cpu_isa(void);

/* Threads used by CPU kernels. n <= 0 means "all hardware threads". The core
 * keeps its own pool of sleeping (not spinning) workers, so it does not
 * compete with the host's threads between calls. */
LC_API lc_status lc_set_num_threads(int32_t n);
LC_API int32_t lc_get_num_threads(void);

/* ------------------------------------------------------------------ */
/* Tensors                                                             */
/* ------------------------------------------------------------------ */

typedef enum { LC_DTYPE_F32 = 0, LC_DTYPE_BF16 = 1, LC_DTYPE_F16 = 2 } lc_dtype;
typedef enum { LC_DEVICE_CPU = 0, LC_DEVICE_CUDA = 1 } lc_device;

#define LC_MAX_DIMS 4

/* A borrowed view of memory. strides are in elements, not bytes. */
typedef struct lc_tensor {
    void* data;
    int32_t dtype;     /* lc_dtype */
    int32_t device;    /* lc_device */
    int32_t device_id; /* CUDA ordinal; 0 for CPU */
    int32_t ndim;      /* 1..LC_MAX_DIMS */
    int64_t shape[LC_MAX_DIMS];
    int64_t strides[LC_MAX_DIMS];
} lc_tensor;

/* ------------------------------------------------------------------ */
/* Block pool: paged-KV bookkeeping with prefix caching                */
/* ------------------------------------------------------------------ */
/*
 * A fixed pool of num_blocks blocks of block_size tokens. Every block is
 * either FREE (ref count 0, on the free list) or IN USE (ref count >= 1).
 * A FULL block may carry a hash that chains its parent's hash with its own
 * tokens; such a block stays findable by lc_block_pool_match_prefix while it
 * sits on the free list, until allocation evicts it (least recently freed
 * first). A hit is verified against the stored tokens, never trusted on the
 * hash alone.
 */

typedef struct lc_block_pool lc_block_pool;

typedef struct lc_block_pool_stats {
    int32_t num_blocks;
    int32_t block_size;
    int32_t num_free;        /* ref count 0 (includes free cached blocks) */
    int32_t num_used;        /* ref count >= 1 */
    int32_t num_cached;      /* blocks that carry a hash (free or used) */
    int32_t num_free_cached; /* free blocks that carry a hash (revivable) */
    int64_t queries;         /* tokens looked up by match_prefix, cumulative */
    int64_t hits;            /* tokens found by match_prefix, cumulative */
    int64_t evictions;       /* cached blocks whose hash was dropped for reuse */
} lc_block_pool_stats;

/* Creates a pool. num_blocks >= 1, block_size in [1, 1024].
 * *out receives a handle the caller frees with lc_block_pool_destroy. */
LC_API lc_status lc_block_pool_create(int32_t num_blocks, int32_t block_size,
                                      lc_block_pool** out);
/* Frees the pool (NULL is a no-op). Outstanding block ids become invalid. */
LC_API void lc_block_pool_destroy(lc_block_pool* pool);

/* Number of blocks an allocation of n could take right now (free blocks). */
LC_API int32_t lc_block_pool_num_free(const lc_block_pool* pool);

/* Allocates n blocks, all or nothing, each with ref count 1, written to
 * out_ids[0..n) (caller-allocated). Cached free blocks are evicted (hash
 * dropped) in least-recently-freed order. LC_ERR_OUT_OF_BLOCKS if fewer
 * than n blocks are free; nothing changes then. */
LC_API lc_status lc_block_pool_allocate(lc_block_pool* pool, int32_t n, int32_t* out_ids);

/* Adds one reference to each block (sharing, e.g. the prompt blocks of n > 1
 * forks). Every id must be in use. All or nothing. */
LC_API lc_status lc_block_pool_fork(lc_block_pool* pool, const int32_t* ids, int32_t n);

/* Drops one reference from each block. A block reaching 0 goes to the tail
 * of the free list (evicted last). Pass a sequence's blocks tail-first so its
 * last blocks are evicted before its shared prefix. All-or-nothing check:
 * every id must be in use (counting repeats). */
LC_API lc_status lc_block_pool_free(lc_block_pool* pool, const int32_t* ids, int32_t n);

/* Root of a hash chain. extra_key separates caches that must not share
 * blocks with the same tokens (a LoRA adapter, a cache salt); 0 is the
 * default namespace. */
LC_API uint64_t lc_block_hash_root(uint64_t extra_key);

/* Hash of one full block of tokens (block_size of them) chained on parent. */
LC_API uint64_t lc_block_hash(uint64_t parent, const int32_t* tokens, int32_t n_tokens);

/* Registers an in-use, full block under hash = lc_block_hash(parent, tokens),
 * storing its tokens for verification; writes the hash to *out_hash (may be
 * NULL). n_tokens must equal block_size. If another block already holds an
 * identical entry, this block stays unregistered (the first copy wins) and
 * LC_OK is returned. Registering a block twice with the same content is a
 * no-op; with other content it is LC_ERR_INVALID_ARGUMENT. */
LC_API lc_status lc_block_pool_commit(lc_block_pool* pool, int32_t block_id, uint64_t parent,
                                      const int32_t* tokens, int32_t n_tokens,
                                      uint64_t* out_hash);

/* Finds the longest chain of cached full blocks that holds tokens[0..n),
 * starting at lc_block_hash_root(extra_key). Only whole blocks match, and at
 * most max_blocks. Each hit gains one reference (a free hit is revived off the
 * free list), and its id is written to out_ids. *out_num_blocks receives the
 * hit count (hit tokens = count * block_size). Counts toward queries/hits.
 * To leave at least one token to compute, pass n = num_tokens - 1. */
LC_API lc_status lc_block_pool_match_prefix(lc_block_pool* pool, uint64_t extra_key,
                                            const int32_t* tokens, int32_t n,
                                            int32_t* out_ids, int32_t max_blocks,
                                            int32_t* out_num_blocks);

/* Ref count of a block (0 when free); negative status for a bad id. */
LC_API int32_t lc_block_pool_ref_count(const lc_block_pool* pool, int32_t block_id);

/* Drops every cached hash (a prefix-cache reset). Blocks in use stay in use. */
LC_API void lc_block_pool_reset_cache(lc_block_pool* pool);

LC_API lc_status lc_block_pool_stats_get(const lc_block_pool* pool, lc_block_pool_stats* out);

/* Verifies every internal invariant (ref counts, free list, hash table);
 * LC_ERR_INTERNAL with a message naming the first broken one. O(num_blocks). */
LC_API lc_status lc_block_pool_check(const lc_block_pool* pool);

/* ------------------------------------------------------------------ */
/* Attention metadata: converted once per step, shared by all layers   */
/* ------------------------------------------------------------------ */
/*
 * A step runs a flattened batch: the new tokens of all sequences stacked
 * into [num_tokens, ...]. Sequence s owns query rows
 * [query_start[s], query_start[s+1]); those rows are the LAST
 * (query_start[s+1] - query_start[s]) tokens of its seq_lens[s] tokens of
 * context, so a decode row has 1 query token and a prefill chunk whose
 * earlier tokens are cached has several. Attention is causal.
 *
 *   seq s:  |<------------- seq_lens[s] ------------->|
 *           | already in the KV cache  | new (queries) |
 */
typedef struct lc_attn_metadata {
    int32_t num_seqs;
    int32_t num_tokens;          /* == query_start[num_seqs] */
    const int32_t* query_start;  /* [num_seqs + 1], non-decreasing, starts at 0 */
    const int32_t* seq_lens;     /* [num_seqs], >= the sequence's query count */
    const int32_t* block_tables; /* [num_seqs][max_blocks_per_seq], row-major */
    int32_t max_blocks_per_seq;
    const int64_t* slot_mapping; /* [num_tokens]; slot < 0 = do not store */
} lc_attn_metadata;

typedef struct lc_attn_plan lc_attn_plan;

/* Validates and copies the metadata (host memory, borrowed for this call)
 * into a plan; for LC_DEVICE_CUDA it also uploads it on `stream`. num_blocks
 * bounds the block ids (0 = do not check). The caller frees *out with
 * lc_attn_plan_destroy. */
LC_API lc_status lc_attn_plan_create(const lc_attn_metadata* md, int32_t device,
                                     int32_t num_blocks, void* stream, lc_attn_plan** out);
LC_API void lc_attn_plan_destroy(lc_attn_plan* plan);

typedef struct lc_attn_params {
    float scale;            /* softmax scale, usually 1/sqrt(head_size) */
    int32_t sliding_window; /* > 0: a query sees only its last N positions; 0 = off */
    float softcap;          /* > 0: logits = softcap * tanh(logits / softcap); 0 = off */
} lc_attn_params;

/* Writes new K/V rows into the paged caches: row t of k/v
 * ([num_tokens, num_kv_heads, head_size], any strides with a unit last
 * stride) goes to slot_mapping[t]; negative slots are skipped. k/v are
 * converted to the cache dtype. */
LC_API lc_status lc_kv_store(const lc_attn_plan* plan, const lc_tensor* k, const lc_tensor* v,
                             const lc_tensor* k_cache, const lc_tensor* v_cache, void* stream);

/* out[t, h, :] = softmax(scale * q[t, h] . K^T) V over the context positions
 * that token t may see, with K/V read from the paged caches (KV head
 * h / (num_heads / num_kv_heads): grouped-query attention).
 * q, out: [num_tokens, num_heads, head_size] (unit last stride);
 * caches: [num_blocks, num_kv_heads, block_size, head_size], contiguous,
 * fp32 or bf16; q/out may be fp32 or bf16. head_size in {32, 64, 80, 96, 128, 256}.
 * Queries are expected to have been stored already (lc_kv_store). */
LC_API lc_status lc_paged_attention(const lc_attn_plan* plan, const lc_tensor* q,
                                    const lc_tensor* k_cache, const lc_tensor* v_cache,
                                    const lc_tensor* out, const lc_attn_params* params,
                                    void* stream);

/* ------------------------------------------------------------------ */
/* Sampling                                                            */
/* ------------------------------------------------------------------ */
/*
 * Per row, in this order (as in vLLM):
 *   logit bias -> banned tokens -> allowed bitmask -> repetition, frequency,
 *   presence penalties -> temperature -> min-p -> top-k -> top-p -> draw.
 * The draw uses a counter-based generator keyed by (seed, position), so a
 * row samples the same token whatever else is in the batch.
 * temperature <= 0 means greedy (argmax after the processing above).
 */

#define LC_NO_TOKEN (-1) /* sampled when every token of a row is masked */

typedef struct lc_sampling_row {
    float temperature;        /* <= 0: greedy */
    int32_t top_k;            /* <= 0: off */
    float top_p;              /* (0, 1]; 1: off */
    float min_p;              /* [0, 1]; 0: off */
    float repetition_penalty; /* > 0; 1: off. Prompt and output tokens. */
    float presence_penalty;   /* 0: off. Output tokens. */
    float frequency_penalty;  /* 0: off. Output tokens. */
    int32_t use_bitmask;      /* 1: apply this row of allowed_bitmask */
    uint64_t seed;            /* the request's seed (the host picks one if unseeded) */
    int64_t position;         /* the draw counter, e.g. index of the output token */
} lc_sampling_row;

enum { LC_LOGPROBS_RAW = 0, LC_LOGPROBS_PROCESSED = 1 };

/* Per-row token lists are CSR: row r owns ids[offsets[r] .. offsets[r+1]).
 * A NULL offsets pointer means "empty for every row". */
typedef struct lc_sampling_batch {
    int32_t num_rows;
    const lc_sampling_row* rows; /* [num_rows] */
    const int32_t* prompt_offsets; /* repetition penalty context */
    const int32_t* prompt_tokens;
    const int32_t* output_offsets; /* all penalties */
    const int32_t* output_tokens;
    const int32_t* bias_offsets; /* additive logit bias */
    const int32_t* bias_tokens;
    const float* bias_values;
    const int32_t* banned_offsets; /* set to -inf (e.g. EOS before min_tokens) */
    const int32_t* banned_tokens;
    const int32_t* allowed_bitmask; /* [num_rows][bitmask_words]; bit (t % 32) of word
                                       t / 32 set = token t allowed; NULL = none */
    int32_t bitmask_words;          /* >= ceil(vocab / 32) when allowed_bitmask is set */
    int32_t num_top_logprobs;       /* 0..vocab: top entries per row (the
                                       CUDA kernel costs O(N x vocab) a row) */
    int32_t logprobs_mode;          /* LC_LOGPROBS_RAW (model's own distribution)
                                       or LC_LOGPROBS_PROCESSED */
} lc_sampling_batch;

/* Caller-allocated host outputs. tokens is required; others may be NULL. */
typedef struct lc_sample_output {
    int32_t* tokens;      /* [num_rows]; LC_NO_TOKEN if every token was masked */
    float* logprobs;      /* [num_rows]: logprob of the sampled token */
    int32_t* ranks;       /* [num_rows]: 1 + number of tokens with a higher logprob */
    int32_t* top_tokens;  /* [num_rows][num_top_logprobs], best first */
    float* top_logprobs;  /* [num_rows][num_top_logprobs] */
} lc_sample_output;

/* Samples one token per row of logits ([num_rows, vocab], fp32 or bf16, unit
 * last stride; not modified). */
LC_API lc_status lc_sample(const lc_tensor* logits, const lc_sampling_batch* batch, void* stream,
                           lc_sample_output* out);

/* The generator behind the draws: a uniform float in [0, 1) for
 * (seed, position, index). Exposed so hosts and tests can reproduce draws. */
LC_API float lc_rng_uniform(uint64_t seed, int64_t position, uint32_t index);

/* ------------------------------------------------------------------ */
/* Linear layers                                                       */
/* ------------------------------------------------------------------ */
/*
 * out[M, N] = x[M, K] @ weight[N, K]^T (+ bias[N]), the projection of a
 * transformer layer (weight in the usual [out_features, in_features] layout).
 *
 *   x:      [M, K] float32, any row stride, unit last stride
 *   weight: [N, K] bfloat16 or float32, contiguous. bf16 weights are widened
 *           to fp32 in registers (a bf16 is the top half of an fp32), so a bf16
 *           model reads half the bytes per token of an fp32 one
 *   bias:   [N] float32 or bfloat16, or NULL for none
 *   out:    [M, N] float32 or bfloat16 (rounded to nearest even), any row
 *           stride, unit last stride; caller-allocated, must not overlap the
 *           inputs
 *
 * Products accumulate in fp32. All tensors are borrowed for the call. CPU
 * only for now: CUDA tensors return LC_ERR_UNSUPPORTED (stream is ignored).
 * The work is split over lc_get_num_threads() threads by columns of out, so
 * each thread reads its own rows of weight. */
LC_API lc_status lc_linear(const lc_tensor* x, const lc_tensor* weight, const lc_tensor* bias,
                           const lc_tensor* out, void* stream);

/*
 * Packed weights: a matrix copied once (at model load) into the layout the
 * linear kernels stream, so that no call repacks it. Panels of 16 output
 * columns, k-major; bf16 or fp32 as the source was; 2 MiB-aligned memory
 * marked for transparent huge pages. The layout is private to the core.
 *
 * lc_weight_pack: copies weight [N, K] (float32 or bfloat16, any row stride,
 * unit last stride, CPU) into a new lc_weight; the caller destroys it with
 * lc_weight_destroy and may free the source at once.
 * lc_weight_info: any of n, k, dtype (lc_dtype) and nbytes (memory held) may
 * be NULL.
 * lc_weight_rows: out[i] = W[rows[i]] for i < count (an embedding lookup on a
 * tied matrix): out [count, K] float32 or bfloat16; rows checked in [0, N).
 * lc_linear_packed: lc_linear with a packed weight; same x, bias, out rules.
 * A packed weight may be used by many threads at once (it is read only). */
typedef struct lc_weight lc_weight;

LC_API lc_status lc_weight_pack(const lc_tensor* weight, lc_weight** out);
LC_API void lc_weight_destroy(lc_weight* weight);
LC_API lc_status lc_weight_info(const lc_weight* weight, int64_t* n, int64_t* k, int32_t* dtype,
                                int64_t* nbytes);
LC_API lc_status lc_weight_rows(const lc_weight* weight, const int64_t* rows, int64_t count,
                                const lc_tensor* out);
LC_API lc_status lc_linear_packed(const lc_tensor* x, const lc_weight* weight,
                                  const lc_tensor* bias, const lc_tensor* out, void* stream);

/*
 * Which kernel family multiplies a packed bf16 weight, where the CPU has two
 * whose roundings differ (AMX: the tiles' tdpbf16ps and AVX512_BF16's
 * vdpbf16ps add a pair of products differently). Each family gives a row the
 * same result whatever M is, so a caller that always sends the same rows to
 * the same family gets results that do not depend on the batch; a server sends
 * the rows of generated tokens (decode: one row per sequence, bound by the
 * weight's bytes) to LC_LINEAR_KERNEL_DOT and prompt rows (compute-bound) to
 * LC_LINEAR_KERNEL_TILES. LC_LINEAR_KERNEL_AUTO is lc_linear_packed's choice:
 * the tiles where usable, at every M. Quantized and fp32 weights have one
 * family (the AMX-INT8 tiles give the VNNI kernel's bits), so the choice does
 * not change their results; on a CPU without the tiles every value runs the
 * dot kernels.
 * lc_linear_packed_kernel: lc_linear_packed with that choice; any other value
 * is LC_ERR_INVALID_ARGUMENT.
 */
typedef enum lc_linear_kernel {
    LC_LINEAR_KERNEL_AUTO = 0,
    LC_LINEAR_KERNEL_DOT = 1,
    LC_LINEAR_KERNEL_TILES = 2
} lc_linear_kernel;

LC_API lc_status lc_linear_packed_kernel(const lc_tensor* x, const lc_weight* weight,
                                         const lc_tensor* bias, const lc_tensor* out,
                                         int32_t kernel, void* stream);

/*
 * Quantized packed weights: a GGUF matrix kept in its own block format, so a
 * decode step reads 4.5-8.5 bits per weight instead of 16.
 *
 * lc_weight_pack_quant: blocks holds W [N, K] as GGUF stores it: N rows, each
 * K/B consecutive blocks of `type` (ggml's block_q8_0, block_q4_0,
 * block_q4_1, block_q5_0, block_q5_1: B = 32 weights of 34, 18, 20, 22, 24
 * bytes; block_q4_K, block_q5_K, block_q6_K: B = 256 weights of 144, 176,
 * 210 bytes), K a multiple of B, nbytes = N * K/B * block size; anything
 * else is LC_ERR_INVALID_ARGUMENT. The packed copy holds 4.5 (q4_0) to 8.5
 * (q8_0) bits per weight: q4_k 4.625, q5_k 5.625, q6_k 6.5625, the others as
 * GGUF's. The blocks are copied (repacked into the kernels' layout; the caller
 * may free them at once) into a new lc_weight, destroyed with
 * lc_weight_destroy like any other. lc_weight_info reports dtype F32 for it
 * (the type of what lc_weight_rows writes) and nbytes of the packed copy.
 * lc_weight_quant_type: the weight's lc_quant_type, 0 for a float weight.
 *
 * lc_linear_packed with a quantized weight: each row of x is quantized per
 * block of 32 to int16 (scale max|x| / 32767, round to nearest; the default)
 * or int8 (max|x| / 127, as llama.cpp's q8 activations), the products are
 * exact integer dot products per block, scaled into fp32 sums: the result is
 * W (dequantized exactly) times x as rounded, within fp32 rounding, the same
 * bits on every instruction set (AVX512_VNNI, AVX2, scalar). lc_weight_rows
 * dequantizes the rows it gathers. CPU only, as every lc_weight.
 * lc_set_quant_activation_bits: 16 or 8 (else LC_ERR_INVALID_ARGUMENT), for
 * every later quantized call in the process; int16 rounds x 256 times more
 * finely at about the same speed with AVX512_VNNI (two vpdpwssd for one
 * vpdpbusd, the loads shared), ~1.3x the int8 cost with AVX2. */
typedef enum {
    LC_QUANT_Q4_0 = 2,
    LC_QUANT_Q4_1 = 3,
    LC_QUANT_Q5_0 = 6,
    LC_QUANT_Q5_1 = 7,
    LC_QUANT_Q8_0 = 8,
    LC_QUANT_Q4_K = 12,
    LC_QUANT_Q5_K = 13,
    LC_QUANT_Q6_K = 14
} lc_quant_type;

LC_API lc_status lc_weight_pack_quant(int32_t type, const void* blocks, int64_t nbytes, int64_t n,
                                      int64_t k, lc_weight** out);
LC_API lc_status lc_weight_quant_type(const lc_weight* weight, int32_t* type);
LC_API lc_status lc_set_quant_activation_bits(int32_t bits);
LC_API int32_t lc_get_quant_activation_bits(void);

/* ------------------------------------------------------------------ */
/* Mixture-of-experts layers                                           */
/* ------------------------------------------------------------------ */
/*
 * lc_moe_experts: the routed SiLU-gated experts of an MoE layer (Qwen3-MoE,
 * Mixtral) in one call; the router (softmax, top-k, renormalisation) stays
 * with the caller:
 *
 *   out[t] = sum_{j < k} topk_weights[t, j] * down_e(silu(g) * u),
 *            [g | u] = gate_up_e(x[t]),  e = topk_ids[t, j]
 *
 *   x:            [T, H] float32, any row stride, unit last stride
 *   topk_ids:     T * k expert indices, row-major [T][k], contiguous, host
 *                 memory; int32 (ids_bytes 4) or int64 (ids_bytes 8); each in
 *                 [0, num_experts), else LC_ERR_INVALID_ARGUMENT naming the
 *                 first bad one. A repeated id in a row is allowed and counts
 *                 once per occurrence (routers never repeat one)
 *   topk_weights: [T, k] float32, k >= 1, any row stride, unit last stride
 *   gate_up:      num_experts packed weights [2I, H]: the gate rows, then the
 *                 up rows
 *   down:         num_experts packed weights [H, I]
 *   out:          [T, H] float32, any row stride, unit last stride; x itself
 *                 or not overlapping any input
 *
 * Every expert must have the same shapes (checked); each matrix may be of
 * any packed format (lc_weight_pack, lc_weight_pack_quant), mixed freely.
 * The routed rows are gathered by expert and each used expert's products run
 * as one multi-row packed linear, so a step reads each used expert's weights
 * once. A token's k terms are added in the order of its top-k list, and a
 * row's products do not depend on the rows routed beside it: out[t] has the
 * same bits whatever else is in the batch and whatever the thread count.
 * Quantized experts give the same bits on every instruction set; float ones
 * agree within fp32 rounding (FMA or not, and bf16 activations with
 * AVX512_BF16, as lc_linear_packed). The call uses T * k * (H + 2I) floats
 * of scratch, kept per calling thread between calls up to 64 MiB (larger ones
 * are freed at return). CPU only: CUDA tensors return LC_ERR_UNSUPPORTED.
 * All arguments are borrowed. */
LC_API lc_status lc_moe_experts(const lc_tensor* x, const void* topk_ids, int32_t ids_bytes,
                                const lc_tensor* topk_weights, const lc_weight* const* gate_up,
                                const lc_weight* const* down, int32_t num_experts,
                                const lc_tensor* out);

/* ------------------------------------------------------------------ */
/* Elementwise operations of a decoder layer                           */
/* ------------------------------------------------------------------ */
/*
 * The small operations between a layer's matmuls, one call per layer instead
 * of a handful of framework ops. Rows of the flattened batch are independent;
 * all tensors are float32 on the CPU, 2-D [T, H] with any row stride and a
 * unit last stride, borrowed for the call.
 *
 * lc_rms_norm: out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight (weight [H]
 * float32 or bfloat16). With a residual ([T, H], not x or out): first
 * residual[t] += x[t], then residual[t] is normalised into out[t], the
 * "add, then norm" of a pre-norm layer. out may be x.
 *
 * lc_silu_mul: out[t, i] = silu(x[t, i]) * x[t, I + i] for x [T, 2I] (gate
 * columns, then up columns), out [T, I].
 *
 * lc_rope: rotary embedding in place, rotate-half (NeoX) layout: q [T, Hq, D]
 * and k [T, Hk, D] (k may be NULL; any strides, unit last stride) are rotated
 * by the angles whose cosines and sines are the rows cos, sin [T, D/2] (one
 * row per token, gathered by the caller for the token's position). */
LC_API lc_status lc_rms_norm(const lc_tensor* x, const lc_tensor* residual,
                             const lc_tensor* weight, float eps, const lc_tensor* out);
LC_API lc_status lc_silu_mul(const lc_tensor* x, const lc_tensor* out);
LC_API lc_status lc_rope(const lc_tensor* q, const lc_tensor* k, const lc_tensor* cos,
                         const lc_tensor* sin);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LLMCORE_H */

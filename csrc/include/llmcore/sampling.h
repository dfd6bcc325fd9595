/*
 * llmcore/sampling.h -- token sampling and its counter-based generator.
 */
#ifndef LLMCORE_SAMPLING_H
#define LLMCORE_SAMPLING_H

#include "llmcore/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

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
    /* Listed logprobs (CSR, like the token lists above): row r reports the
     * logprob, in logprobs_mode, of each id of logprob_ids[logprob_offsets[r] ..
     * logprob_offsets[r+1]), in list order (repeats allowed), into
     * out.listed_logprobs[i - logprob_offsets[0]] for list index i. Each costs
     * O(1) once the row's normalizer is known; the host bounds how many a
     * request may list. NULL offsets: none. */
    const int32_t* logprob_offsets;
    const int32_t* logprob_ids;
} lc_sampling_batch;

/* Caller-allocated host outputs. tokens is required; others may be NULL. */
typedef struct lc_sample_output {
    int32_t* tokens;      /* [num_rows]; LC_NO_TOKEN if every token was masked */
    float* logprobs;      /* [num_rows]: logprob of the sampled token */
    int32_t* ranks;       /* [num_rows]: 1 + number of tokens with a higher logprob */
    int32_t* top_tokens;  /* [num_rows][num_top_logprobs], best first */
    float* top_logprobs;  /* [num_rows][num_top_logprobs] */
    float* listed_logprobs; /* [logprob_offsets[num_rows] - logprob_offsets[0]];
                               required when the batch lists any id */
} lc_sample_output;

/* Samples one token per row of logits ([num_rows, vocab], fp32 or bf16, unit
 * last stride; not modified). */
LC_API lc_status lc_sample(const lc_tensor* logits, const lc_sampling_batch* batch, void* stream,
                           lc_sample_output* out);

/* The generator behind the draws: a uniform float in [0, 1) for
 * (seed, position, index). Exposed so hosts and tests can reproduce draws. */
LC_API float lc_rng_uniform(uint64_t seed, int64_t position, uint32_t index);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LLMCORE_SAMPLING_H */

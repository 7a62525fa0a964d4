/* Model specs that several suites train. A header of its own, with the text
 * in it (no object to link): test_cuda_api.c, which test_cuda_emul links
 * without libdptest.a, and standalone/test_noalloc.c, which keeps its own
 * names for what helpers.h declares, include this one alone. */
#ifndef DP_TEST_SPECS_H
#define DP_TEST_SPECS_H

/* Every kind of layer without an image (linear with and without a bias,
 * layernorm, the four activations, dropout; softmax cross-entropy), on 12
 * inputs and 5 classes. */
static const char MLP_EVERY_KIND_SPEC[] = "input 12\n"
                                          "linear 16\nlayernorm\ngelu\ndropout 0.2\n"
                                          "linear 16\ntanh\n"
                                          "linear 16\nsigmoid\n"
                                          "linear 16\nrelu\n"
                                          "linear 5 nobias\n"
                                          "loss softmax_cross_entropy\n";

/* A 2-block pre-LN GPT (tests/golden's gpt_tiny shape, smaller): 8 token ids
 * per row, a vocabulary of 11, width 8, 2 heads, dropout in the MLP. */
static const char GPT_SPEC[] =
    "input tokens 6\n"
    "embed 11 8\n"
    "residual\nlayernorm\nlinear 24\nattention 2\nlinear 8\nend\n"
    "residual\nlayernorm\nlinear 16\ngelu\ndropout 0.1\n"
    "linear 8\nend\n"
    "layernorm\nlinear 11\n"
    "loss softmax_cross_entropy\n";
enum { GPT_T = 6, GPT_V = 11 };

/* GPT_SPEC with dropout on the attention probabilities and a tied output head. */
static const char GPT_ADROP_SPEC[] =
    "input tokens 6\n"
    "embed 11 8\n"
    "residual\nlayernorm\nlinear 24\nattention 2 dropout 0.3\n"
    "linear 8\nend\n"
    "residual\nlayernorm\nlinear 16\ngelu\ndropout 0.1\n"
    "linear 8\nend\n"
    "layernorm\nlinear 11 tied\n"
    "loss softmax_cross_entropy\n";

#endif

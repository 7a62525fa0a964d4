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

#endif

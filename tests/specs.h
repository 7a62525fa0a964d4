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

/* torchvision's ResNet blocks, small, in dp_model_format's form: an identity
 * block, then a downsampling one with a projection shortcut (f(x) + g(x), g:
 * conv1x1 stride 2 and batchnorm) whose f ends in a plain block nested in it,
 * and a plain block nested in g too; 3 x 8 x 8 inputs, 5 classes. */
static const char RESNET_PROJ_SPEC[] = "input 3 8 8\n"
                                       "conv2d 4 3 padding 1 nobias\n"
                                       "batchnorm\n"
                                       "relu\n"
                                       "residual\n"
                                       "  conv2d 4 3 padding 1 nobias\n"
                                       "  batchnorm\n"
                                       "end\n"
                                       "relu\n"
                                       "residual\n"
                                       "  conv2d 6 3 stride 2 padding 1 nobias\n"
                                       "  batchnorm\n"
                                       "  relu\n"
                                       "  residual\n"
                                       "    conv2d 6 3 padding 1\n"
                                       "    tanh\n"
                                       "  end\n"
                                       "shortcut\n"
                                       "  residual\n"
                                       "    relu\n"
                                       "  end\n"
                                       "  conv2d 6 1 stride 2 nobias\n"
                                       "  batchnorm\n"
                                       "end\n"
                                       "relu\n"
                                       "avgpool2d 2\n"
                                       "flatten\n"
                                       "linear 5\n"
                                       "loss softmax_cross_entropy\n";

/* Residual blocks around batchnorm on flat rows, for sync batchnorm (whose
 * backward stops at every batchnorm, inside the blocks): a block on the
 * model's input (its skip gradient is the input's, none), a post-activation
 * block (linear, batchnorm, relu), a pre-activation one (batchnorm first,
 * right after the begin) with a block nested in it, and a last block that
 * ends the model (its skip gradient is the output's); 12 inputs, 5 classes. */
static const char RESNET_MLP_SPEC[] = "input 12\n"
                                      "residual\n"
                                      "  linear 12\n"
                                      "  batchnorm\n"
                                      "end\n"
                                      "linear 8\n"
                                      "residual\n"
                                      "  linear 8\n"
                                      "  batchnorm\n"
                                      "  relu\n"
                                      "end\n"
                                      "residual\n"
                                      "  batchnorm\n"
                                      "  tanh\n"
                                      "  residual\n"
                                      "    linear 8 nobias\n"
                                      "    batchnorm\n"
                                      "  end\n"
                                      "  linear 8\n"
                                      "end\n"
                                      "linear 5\n"
                                      "residual\n"
                                      "  batchnorm\n"
                                      "  linear 5\n"
                                      "end\n"
                                      "loss softmax_cross_entropy\n";

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

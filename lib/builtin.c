/* The backends libdp.a has built in. The one file that names them: the
 * registry (lib/core/registry.c) starts from this list and names none itself;
 * every other backend registers from its own library (dp_cuda_register). */
#include "cpu/cpu.h"

const dp_backend_ops *const dp__builtin_backends[] = {&dp__cpu_backend, NULL};

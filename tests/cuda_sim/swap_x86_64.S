/* The fibers' context switch of the CUDA simulation (kernel.cc), x86-64 System V. */
#if defined(__x86_64__)
  .text
  .globl dp_sim_swap
  .type dp_sim_swap, @function
dp_sim_swap:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size dp_sim_swap, .-dp_sim_swap
#endif
  .section .note.GNU-stack,"",@progbits

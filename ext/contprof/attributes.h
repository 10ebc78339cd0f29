// Compiler attributes the C files share (plain C: no Ruby headers).
#pragma once

// A parameter a function must take but does not use (a callback's signature, a Ruby
// method's receiver): said so, so that -Wunused-parameter speaks only of mistakes.
#define CONTPROF_UNUSED __attribute__((unused))

// Contprof::Collectors::CpuAndWallTimeWorker, the Ruby class that decides when to sample
// (see cpu_and_wall_time_worker.c).
#pragma once

#include <ruby.h>

void contprof_worker_class_init(VALUE contprof_module);

// What every backend of vm/vm.h shares because it needs only Ruby's public API. Private to
// the vm/ folder.
#pragma once

#include <stdbool.h>

// Called by each backend's contprof_vm_init (holding the GVL; allocates).
void contprof_vm_common_init(void);

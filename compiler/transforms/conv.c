/* Transpose rules of convolution. */
#include "compiler/transforms/rules.h"

int kiln__vjp_convolution(kiln__ad *c, const kiln_instr *ins, kiln_id ct) {
  return kiln__tx_fail(c->tx, KILN_EUNIMPL, ins, "%s: convolution has no transpose yet", c->tx->name);
}

/* Graphviz DOT rendering of a module: one cluster per computation, one node
 * per instruction labelled with its opcode and shape, operand edges, and
 * dashed edges to called computations' roots. Names are escaped; the output
 * is for people, not for parsing back. */
#include <stdio.h>

#include "common/alloc.h"
#include "compiler/pass.h"

static void put_escaped(kiln_sbuf *b, const char *s) {
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') kiln_sbuf_putc(b, '\\');
    if (*s == '\n') {
      kiln_sbuf_puts(b, "\\n");
      continue;
    }
    kiln_sbuf_putc(b, *s);
  }
}

char *kiln_module_to_dot(const kiln_module *m, size_t *len) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_puts(&b, "digraph \"");
  put_escaped(&b, m->name);
  kiln_sbuf_puts(&b, "\" {\n  node [shape=box, fontname=\"monospace\"];\n");
  for (uint32_t c = 0; c < m->ncomps; c++) {
    const kiln_computation *comp = m->comps[c];
    kiln_sbuf_printf(&b, "  subgraph cluster_%u {\n    label=\"", c);
    if (c == m->entry) kiln_sbuf_puts(&b, "ENTRY ");
    put_escaped(&b, comp->name);
    kiln_sbuf_puts(&b, "\";\n");
    for (uint32_t i = 0; i < comp->ninstrs; i++) {
      const kiln_instr *ins = m->instrs[comp->instrs[i]];
      kiln_sbuf_printf(&b, "    n%u [label=\"", ins->id);
      put_escaped(&b, ins->name);
      kiln_sbuf_puts(&b, "\\n");
      kiln_sbuf_puts(&b, kiln_opcode_name(ins->op));
      kiln_sbuf_puts(&b, " ");
      kiln_sbuf s = KILN_SBUF_INIT;
      kiln_shape_print_short(&s, &ins->shape);
      put_escaped(&b, kiln_sbuf_str(&s));
      kiln_sbuf_free(&s);
      kiln_sbuf_printf(&b, "\"%s];\n", ins->id == comp->root ? ", peripheries=2" : "");
    }
    kiln_sbuf_puts(&b, "  }\n");
  }
  for (uint32_t c = 0; c < m->ncomps; c++) {
    const kiln_computation *comp = m->comps[c];
    for (uint32_t i = 0; i < comp->ninstrs; i++) {
      const kiln_instr *ins = m->instrs[comp->instrs[i]];
      for (uint32_t k = 0; k < ins->noperands; k++)
        kiln_sbuf_printf(&b, "  n%u -> n%u;\n", ins->operands[k], ins->id);
      for (uint32_t k = 0; k < ins->ncalled; k++) {
        const kiln_computation *callee = kiln_module_computation(m, ins->called[k]);
        if (callee && callee->root != KILN_NO_ID)
          kiln_sbuf_printf(&b, "  n%u -> n%u [style=dashed];\n", callee->root, ins->id);
      }
    }
  }
  kiln_sbuf_puts(&b, "}\n");
  return kiln_sbuf_detach(&b, len);
}

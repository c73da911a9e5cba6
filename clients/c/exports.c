/* The parts of the IR that kiln.h hands to users but libkiln itself never
 * calls: the text parser and printer. libkiln.so is linked from the static
 * project libraries, which contribute only the objects something refers
 * to; this table refers to them, so that every function declared in the
 * installed headers is in the library (libkiln.map then exports it). */
#include "clients/c/kiln.h"
#include "compiler/ir/verify.h"

typedef void (*any_fn)(void);

__attribute__((used)) static const any_fn exported[] = {
    (any_fn)kiln_module_parse_text, (any_fn)kiln_literal_parse_text, (any_fn)kiln_module_print,
    (any_fn)kiln_module_print_to,   (any_fn)kiln_literal_print,      (any_fn)kiln_module_verify,
    (any_fn)kiln_infer_shape,
};

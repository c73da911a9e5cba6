/* Anchor for the kiln_proto library: its real contents are the protobuf-c
 * stubs generated from proto/kiln/v1/*.proto at build time. */
typedef int kiln_proto_anchor;

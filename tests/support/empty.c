/* Keeps the support library non-empty before any helper exists. */
typedef int kiln_test_support_empty;

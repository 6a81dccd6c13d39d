/*
 * dt_api.h: DT_API, the mark of a function that libdtrain exports.
 *
 * The library is compiled with -fvisibility=hidden (configure's
 * DT_VISIBILITY_CFLAGS), so a symbol leaves libdtrain.so only when its
 * declaration in an installed header starts with DT_API. Everything else (the
 * clock, the testing hook, the store, the backends' internals, the layer rows)
 * stays inside: a program cannot come to depend on it, the dynamic symbol table
 * stays small, and calls between the library's own functions need no PLT.
 * The programs and tests of this tree link the library's objects directly
 * (libdtrain_core, Makefile.am) and reach the private headers too.
 * tests/exports.sh holds the exported set to the functions of the installed
 * headers.
 */
#ifndef DT_API_H
#define DT_API_H

#if defined(__GNUC__) && __GNUC__ >= 4
#define DT_API __attribute__((visibility("default")))
#else
#define DT_API
#endif

#endif /* DT_API_H */

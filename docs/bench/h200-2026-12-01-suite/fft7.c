// What does entry [7] of the driver's export table 6e163fbe (tools module) do for cuFFT?
// LD_PRELOAD this; cuGetExportTable(6e163fbe...) hands out a copy of NVIDIA's table whose [7]
// logs its arguments (and 64 bytes behind each), wraps the callback it is given so that each
// call of it is logged the same way (before and after it runs), and logs the driver's result.
// build: gcc -O2 -shared -fPIC -o /tmp/libfft7.so fft7.c -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>
typedef int (*get_t)(const void **, const unsigned char *);
typedef int (*gpa1_t)(const char *, void **, int, unsigned long long);
typedef int (*gpa2_t)(const char *, void **, int, unsigned long long, int *);
typedef uint64_t (*fn6)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);
static void *(*real_dlsym)(void *, const char *);
static get_t real_get; static gpa1_t real_gpa1; static gpa2_t real_gpa2;
static uint64_t copy[128]; static fn6 real7, real_cb; static int ncalls;
static void init(void) {
  if (!real_dlsym) real_dlsym = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (!real_dlsym) real_dlsym = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
}
static void dump(const char *tag, int k, uint64_t p) {
  unsigned char b[64]; struct iovec l = {b, 64}, r = {(void *)p, 64};
  if (p < 4096 || process_vm_readv(getpid(), &l, 1, &r, 1, 0) != 64) return;
  fprintf(stderr, "[fft7]   %s a%d=%#lx:", tag, k, (unsigned long)p);
  for (int i = 0; i < 64; i++) fprintf(stderr, "%s%02x", i % 8 ? "" : " ", b[i]);
  Dl_info d; if (dladdr((void *)p, &d) && d.dli_fname) fprintf(stderr, " (%s%s%s)", strrchr(d.dli_fname, '/') ? strrchr(d.dli_fname, '/') + 1 : d.dli_fname, d.dli_sname ? " " : "", d.dli_sname ? d.dli_sname : "");
  fprintf(stderr, "\n");
}
static uint64_t cb(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t e, uint64_t f) {
  uint64_t v[6] = {a, b, c, d, e, f};
  int n = ++ncalls;
  fprintf(stderr, "[fft7] callback #%d (%#lx, %#lx, %#lx, %#lx, %#lx, %#lx)\n", n, a, b, c, d, e, f);
  for (int k = 0; k < 6; k++) dump("before", k, v[k]);
  uint64_t r = real_cb(a, b, c, d, e, f);
  fprintf(stderr, "[fft7] callback #%d -> %#lx\n", n, (unsigned long)r);
  for (int k = 0; k < 6; k++) dump("after", k, v[k]);
  return r;
}
static uint64_t w7(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t e, uint64_t f) {
  uint64_t v[6] = {a, b, c, d, e, f};
  fprintf(stderr, "[fft7] [7](%#lx, %#lx, %#lx, %#lx, %#lx, %#lx)\n", a, b, c, d, e, f);
  for (int k = 0; k < 6; k++) dump("in", k, v[k]);
  uint64_t cc = c;
  if (c && !getenv("FFT7_NOWRAP")) { real_cb = (fn6)c; cc = (uint64_t)cb; }
  uint64_t r = real7(a, b, cc, d, e, f);
  fprintf(stderr, "[fft7] [7] -> %lu\n", (unsigned long)r);
  for (int k = 0; k < 6; k++) dump("out", k, v[k]);
  return r;
}
static int my_get(const void **tbl, const unsigned char *id) {
  int r = real_get(tbl, id);
  if (r || id[0] != 0x6e || id[1] != 0x16 || id[2] != 0x3f || id[3] != 0xbe) return r;
  const uint64_t *t = *tbl; size_t words = t[0] / 8;
  fprintf(stderr, "[fft7] table 6e163fbe: %zu words\n", words);
  if (words > 128) return r;
  memcpy(copy, t, words * 8); real7 = (fn6)t[7]; copy[7] = (uint64_t)w7; *tbl = copy;
  return r;
}
static void *fix(const char *s, void *p) {
  if (p && !strcmp(s, "cuGetExportTable")) { real_get = p; return (void *)my_get; }
  return p;
}
static int my_gpa1(const char *s, void **pf, int v, unsigned long long f);
static int my_gpa2(const char *s, void **pf, int v, unsigned long long f, int *st);
static void hook(const char *s, void **pf) {
  if (!strcmp(s, "cuGetProcAddress")) { real_gpa1 = *pf; *pf = (void *)my_gpa1; }
  else if (!strcmp(s, "cuGetProcAddress_v2")) { real_gpa2 = *pf; *pf = (void *)my_gpa2; }
  else *pf = fix(s, *pf);
}
static int my_gpa1(const char *s, void **pf, int v, unsigned long long f) {
  int r = real_gpa1(s, pf, v, f); if (!r && *pf) hook(s, pf); return r;
}
static int my_gpa2(const char *s, void **pf, int v, unsigned long long f, int *st) {
  int r = real_gpa2(s, pf, v, f, st); if (!r && *pf) hook(s, pf); return r;
}
void *dlsym(void *h, const char *s) {
  init(); void *p = real_dlsym(h, s);
  if (!p || s[0] != 'c' || s[1] != 'u') return p;
  if (!strcmp(s, "cuGetProcAddress")) { real_gpa1 = p; return (void *)my_gpa1; }
  if (!strcmp(s, "cuGetProcAddress_v2")) { real_gpa2 = p; return (void *)my_gpa2; }
  return fix(s, p);
}

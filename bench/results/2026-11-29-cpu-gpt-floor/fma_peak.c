/* The core's f32 FMA peak: 12 independent chains of 256-bit FMAs (Zen 4 runs two a cycle;
 * 512-bit ones as two halves), 400 M iterations. gcc -O2 -mavx2 -mfma fma_peak.c -o fma_peak */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
int main(){
  __m256 a[12]; for(int i=0;i<12;i++) a[i]=_mm256_set1_ps(i*0.001f);
  __m256 b=_mm256_set1_ps(0.9999f), c=_mm256_set1_ps(1e-7f);
  struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0);
  long n=400000000;
  for(long k=0;k<n;k++){
#pragma GCC unroll 12
    for(int i=0;i<12;i++) a[i]=_mm256_fmadd_ps(a[i],b,c);
  }
  clock_gettime(CLOCK_MONOTONIC,&t1);
  double s=(t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)*1e-9;
  float acc=0; for(int i=0;i<12;i++) acc+=a[i][0];
  printf("%.1f GFLOP/s (256-bit FMAs) %f\n", n*12.0*16/s/1e9, acc);
}

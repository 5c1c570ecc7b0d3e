#define _GNU_SOURCE
#include <cblas.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
extern void openblas_set_num_threads(int);
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
typedef struct {int m,n,k,reps,cpu; double gf;} job;
static void* run(void* p){job* j=p; cpu_set_t s; CPU_ZERO(&s); CPU_SET(j->cpu,&s); pthread_setaffinity_np(pthread_self(),sizeof s,&s);
 float*a=malloc(4L*j->m*j->k),*b=malloc(4L*j->n*j->k),*c=malloc(4L*j->m*j->n);
 for(long i=0;i<(long)j->m*j->k;i++)a[i]=(i%7)*0.1f; for(long i=0;i<(long)j->n*j->k;i++)b[i]=(i%5)*0.1f;
 cblas_sgemm(CblasRowMajor,CblasNoTrans,CblasTrans,j->m,j->n,j->k,1,a,j->k,b,j->k,0,c,j->n);
 double t=now(); for(int r=0;r<j->reps;r++) cblas_sgemm(CblasRowMajor,CblasNoTrans,CblasTrans,j->m,j->n,j->k,1,a,j->k,b,j->k,0,c,j->n);
 t=now()-t; j->gf=2.0*j->m*j->n*j->k*j->reps/t/1e9; return 0;}
int main(int argc,char**argv){openblas_set_num_threads(1); int m=atoi(argv[1]),n=atoi(argv[2]),k=atoi(argv[3]),reps=atoi(argv[4]);
 job a={m,n,k,reps,0},b={m,n,k,reps,1}; pthread_t t1,t2;
 for(int round=0;round<3;round++){
 run(&a); printf("one thread: %.1f GFLOP/s\n",a.gf);
 pthread_create(&t1,0,run,&a); pthread_create(&t2,0,run,&b); pthread_join(t1,0); pthread_join(t2,0);
 printf("two at once: %.1f + %.1f GFLOP/s\n",a.gf,b.gf);}
}

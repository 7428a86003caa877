/* The optimizers' update kernels, one fused loop per parameter following
 * torch.optim's single-tensor code paths (torch/optim/sgd.py
 * `_single_tensor_sgd`, adam.py `_single_tensor_adam`, adamw.py,
 * adadelta.py `_single_tensor_adadelta`, rmsprop.py
 * `_single_tensor_rmsprop`), with torch's operation order so that float32
 * results match its CPU kernels. */
/* Full vectoriser (see tensor/kernels.c).  The Makefile builds this folder
 * with -fno-math-errno (a pragma cannot), so sqrtf vectorises. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#include "optim/update.h"

#include <math.h>

#include "tensor/kernels.h"

DDP_KERNEL void ddp__sgd_update(float *restrict w, const float *restrict g, float *restrict buf,
                                size_t n, const ddp_sgd_options *o, int first)
{
    const float lr = (float)o->lr, wd = (float)o->weight_decay, mom = (float)o->momentum;
    const float damp = (float)(1.0 - o->dampening), sign = o->maximize ? -1.0f : 1.0f;
    if (mom == 0.0f) {
        for (size_t i = 0; i < n; i++)
            w[i] -= lr * (sign * g[i] + wd * w[i]);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float d = sign * g[i] + wd * w[i];
        float b = first ? d : mom * buf[i] + damp * d; /* first step: buf = clone(d) */
        buf[i] = b;
        w[i] -= lr * (o->nesterov ? d + mom * b : b);
    }
}

/* `ams` is a constant at each call site below, so each loop is specialised
 * and branch-free. */
static inline __attribute__((always_inline)) void
adam_loop(float *restrict w, const float *restrict g, float *restrict m, float *restrict v,
          float *restrict vmax, size_t n, const ddp_adam_options *o, int decoupled,
          int64_t step, int ams)
{
    /* 1 - beta in double first, as torch does with its Python scalars */
    const float b1 = (float)o->beta1, b2 = (float)o->beta2;
    const float c1 = (float)(1.0 - o->beta1), c2 = (float)(1.0 - o->beta2);
    const float eps = (float)o->eps, sign = o->maximize ? -1.0f : 1.0f;
    const float wd = decoupled ? 0.0f : (float)o->weight_decay;
    const float shrink = decoupled ? (float)(1.0 - o->lr * o->weight_decay) : 1.0f;
    double bc1 = 1.0 - pow(o->beta1, (double)step), bc2 = 1.0 - pow(o->beta2, (double)step);
    const float step_size = (float)(o->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    for (size_t i = 0; i < n; i++) {
        float wi = w[i] * shrink;
        float gi = sign * g[i] + wd * wi;
        float mi = m[i] * b1 + c1 * gi;
        float vi = v[i] * b2 + c2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        if (ams) {
            vi = vmax[i] > vi ? vmax[i] : vi;
            vmax[i] = vi;
        }
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        w[i] = wi - step_size * mi / denom;
    }
}

DDP_KERNEL void ddp__adam_update(float *restrict w, const float *restrict g, float *restrict m,
                                 float *restrict v, float *restrict vmax, size_t n,
                                 const ddp_adam_options *o, int decoupled, int64_t step)
{
    if (vmax)
        adam_loop(w, g, m, v, vmax, n, o, decoupled, step, 1);
    else
        adam_loop(w, g, m, v, NULL, n, o, decoupled, step, 0);
}

/* square_avg = rho sq + (1 - rho) g^2; std = sqrt(sq + eps);
 * delta = sqrt(acc + eps) / std * g; acc = rho acc + (1 - rho) delta^2;
 * w -= lr delta, in that order (torch's). */
DDP_KERNEL void ddp__adadelta_update(float *restrict w, const float *restrict g,
                                     float *restrict sq, float *restrict acc, size_t n,
                                     const ddp_adadelta_options *o)
{
    const float rho = (float)o->rho, c = (float)(1.0 - o->rho), eps = (float)o->eps;
    const float lr = (float)o->lr, wd = (float)o->weight_decay;
    const float sign = o->maximize ? -1.0f : 1.0f;
    for (size_t i = 0; i < n; i++) {
        float gi = sign * g[i] + wd * w[i];
        float s = sq[i] * rho + c * gi * gi;
        float delta = sqrtf(acc[i] + eps) / sqrtf(s + eps) * gi;
        sq[i] = s;
        acc[i] = acc[i] * rho + c * delta * delta;
        w[i] += -lr * delta;
    }
}

/* `mom` and `centered` are constants at each call site below. */
static inline __attribute__((always_inline)) void
rmsprop_loop(float *restrict w, const float *restrict g, float *restrict sq,
             float *restrict buf, float *restrict gavg, size_t n, const ddp_rmsprop_options *o,
             int mom, int centered)
{
    const float alpha = (float)o->alpha, c = (float)(1.0 - o->alpha), eps = (float)o->eps;
    const float lr = (float)o->lr, wd = (float)o->weight_decay, m = (float)o->momentum;
    const float sign = o->maximize ? -1.0f : 1.0f;
    for (size_t i = 0; i < n; i++) {
        float gi = sign * g[i] + wd * w[i];
        float s = sq[i] * alpha + c * gi * gi;
        sq[i] = s;
        float avg;
        if (centered) {
            float ga = gavg[i] * alpha + c * gi;
            gavg[i] = ga;
            avg = sqrtf(s + -1.0f * ga * ga) + eps;
        } else {
            avg = sqrtf(s) + eps;
        }
        if (mom) {
            float b = buf[i] * m + gi / avg;
            buf[i] = b;
            w[i] += -lr * b;
        } else {
            w[i] += -lr * gi / avg; /* addcdiv: (value * t1) / t2 */
        }
    }
}

DDP_KERNEL void ddp__rmsprop_update(float *restrict w, const float *restrict g,
                                    float *restrict sq, float *restrict buf,
                                    float *restrict gavg, size_t n,
                                    const ddp_rmsprop_options *o)
{
    if (buf && gavg)
        rmsprop_loop(w, g, sq, buf, gavg, n, o, 1, 1);
    else if (buf)
        rmsprop_loop(w, g, sq, buf, NULL, n, o, 1, 0);
    else if (gavg)
        rmsprop_loop(w, g, sq, NULL, gavg, n, o, 0, 1);
    else
        rmsprop_loop(w, g, sq, NULL, NULL, n, o, 0, 0);
}

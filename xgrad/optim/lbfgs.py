"""``LBFGS``: PyTorch's L-BFGS, with its strong-Wolfe line search, transcribed onto flat JAX arrays.

The algorithm decides on values at every iteration (when to stop, how far to search)
and calls the closure a data-dependent number of times, so it runs eagerly, as in
PyTorch; a step is not compiled (``xgrad.compile`` the closure's work instead).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from xgrad import step_trace
from xgrad.grad_mode import enable_grad
from xgrad.optim.optimizer import Optimizer, check_nonnegative, loaded_value
from xgrad.tensor import Tensor


def _cubic_interpolate(x1: Any, f1: Any, g1: Any, x2: Any, f2: Any, g2: Any, bounds: tuple[Any, Any] | None = None) -> Any:
    """The minimizer of the cubic through two points with their slopes, clamped to ``bounds``."""
    xmin_bound, xmax_bound = bounds if bounds is not None else ((x1, x2) if x1 <= x2 else (x2, x1))
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1**2 - g1 * g2
    if d2_square >= 0:
        d2 = jnp.sqrt(d2_square)
        if x1 <= x2:
            min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
        else:
            min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
        return min(max(min_pos, xmin_bound), xmax_bound)
    return (xmin_bound + xmax_bound) / 2.0


def _strong_wolfe(
    obj_func: Callable[[Any, Any], tuple[float, Any]], t: Any, d: Any, f: float, g: Any, gtd: Any,
    c1: float = 1e-4, c2: float = 0.9, tolerance_change: float = 1e-9, max_ls: int = 25,
) -> tuple[float, Any, Any, int]:
    """PyTorch's ``_strong_wolfe``: bracket a step meeting the strong Wolfe conditions, then zoom into it."""
    d_norm = jnp.max(jnp.abs(d))
    f_new, g_new = obj_func(t, d)
    ls_func_evals = 1
    gtd_new = g_new @ d
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    done = False
    ls_iter = 0
    bracket: list[Any] = []
    bracket_f: list[Any] = []
    bracket_g: list[Any] = []
    bracket_gtd: list[Any] = []
    while ls_iter < max_ls:
        if f_new > (f + c1 * t * gtd) or (ls_iter > 1 and f_new >= f_prev):
            bracket, bracket_f, bracket_g, bracket_gtd = [t_prev, t], [f_prev, f_new], [g_prev, g_new], [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
            done = True
            break
        if gtd_new >= 0:
            bracket, bracket_f, bracket_g, bracket_gtd = [t_prev, t], [f_prev, f_new], [g_prev, g_new], [gtd_prev, gtd_new]
            break
        min_step = t + 0.01 * (t - t_prev)
        max_step = t * 10
        tmp = t
        t = _cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(min_step, max_step))
        t_prev, f_prev, g_prev, gtd_prev = tmp, f_new, g_new, gtd_new
        f_new, g_new = obj_func(t, d)
        ls_func_evals += 1
        gtd_new = g_new @ d
        ls_iter += 1
    if ls_iter == max_ls:
        bracket, bracket_f, bracket_g = [0, t], [f, f_new], [g, g_new]

    # Zoom: shrink the bracket until a point meets the conditions.
    insuf_progress = False
    low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_interpolate(bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1], bracket_gtd[1])
        # Keep away from the bracket's ends: step to within 10% of its width after a stall.
        eps = 0.1 * (max(bracket) - min(bracket))
        if min(max(bracket) - t, t - min(bracket)) < eps:
            if insuf_progress or t >= max(bracket) or t <= min(bracket):
                t = max(bracket) - eps if abs(t - max(bracket)) < abs(t - min(bracket)) else min(bracket) + eps
                insuf_progress = False
            else:
                insuf_progress = True
        else:
            insuf_progress = False
        f_new, g_new = obj_func(t, d)
        ls_func_evals += 1
        gtd_new = g_new @ d
        ls_iter += 1
        if f_new > (f + c1 * t * gtd) or f_new >= bracket_f[low_pos]:
            bracket[high_pos], bracket_f[high_pos], bracket_g[high_pos], bracket_gtd[high_pos] = t, f_new, g_new, gtd_new
            low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high_pos] - bracket[low_pos]) >= 0:
                bracket[high_pos], bracket_f[high_pos] = bracket[low_pos], bracket_f[low_pos]
                bracket_g[high_pos], bracket_gtd[high_pos] = bracket_g[low_pos], bracket_gtd[low_pos]
            bracket[low_pos], bracket_f[low_pos], bracket_g[low_pos], bracket_gtd[low_pos] = t, f_new, g_new, gtd_new
    return bracket_f[low_pos], bracket_g[low_pos], bracket[low_pos], ls_func_evals


class LBFGS(Optimizer):
    """``torch.optim.LBFGS``: limited-memory BFGS over all parameters as one flat vector; ``step(closure)``.

    One parameter group only. ``state`` is kept under the first parameter, as PyTorch
    does (``func_evals``, ``n_iter``, ``d``, ``t``, ``old_dirs``, ``old_stps``, ``ro``,
    ``H_diag``, ``prev_flat_grad``, ``prev_loss``).

    >>> import xgrad
    >>> w = xgrad.tensor([3.0, -2.0], requires_grad=True)
    >>> opt = xgrad.optim.LBFGS([w], line_search_fn="strong_wolfe")
    >>> def closure():
    ...     opt.zero_grad()
    ...     loss = ((w - 1.0) ** 2).sum()
    ...     loss.backward()
    ...     return loss
    >>> _ = opt.step(closure); [round(v, 4) for v in w.tolist()]
    [1.0, 1.0]
    """

    def __init__(
        self, params: Any, lr: float | Tensor = 1, max_iter: int = 20, max_eval: int | None = None,
        tolerance_grad: float = 1e-7, tolerance_change: float = 1e-9, history_size: int = 100,
        line_search_fn: str | None = None, *, maximize: bool = False,
    ) -> None:
        check_nonnegative("learning rate", lr)
        defaults = {
            "lr": lr, "max_iter": max_iter, "max_eval": max_iter * 5 // 4 if max_eval is None else max_eval,
            "tolerance_grad": tolerance_grad, "tolerance_change": tolerance_change, "history_size": history_size,
            "line_search_fn": line_search_fn, "maximize": maximize,
        }
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")
        self._params: list[Tensor] = self.param_groups[0]["params"]

    def _gather_flat_grad(self) -> Any:
        flat = jnp.concatenate([
            jnp.zeros(p.numel(), p.dtype) if p._grad is None else p._grad._array.reshape(-1) for p in self._params
        ])
        return -flat if self.param_groups[0]["maximize"] else flat

    def _add_grad(self, step_size: Any, update: Any) -> None:
        offset = 0
        for p in self._params:
            n = p.numel()
            p._array = p._array + (step_size * update[offset:offset + n]).reshape(p.shape).astype(p.dtype)
            p._version += 1
            offset += n

    def _set_param(self, arrays: list[Any]) -> None:
        for p, array in zip(self._params, arrays, strict=True):
            p._array = array
            p._version += 1

    def _evaluate(self, closure: Callable[[], Any]) -> float:
        with enable_grad():
            loss = float(closure())
        return -loss if self.param_groups[0]["maximize"] else loss

    def _directional_evaluate(self, closure: Callable[[], Any], start: list[Any], step: Any, direction: Any) -> tuple[float, Any]:
        """The loss and flat gradient at ``start + step * direction``; the parameters go back to ``start``."""
        self._add_grad(step, direction)
        value = self._evaluate(closure)
        grad = self._gather_flat_grad()
        self._set_param(start)
        return value, grad

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # noqa: C901 (PyTorch's loop, kept whole)
        """Up to ``max_iter`` L-BFGS iterations, calling ``closure`` (which must recompute the loss and its grads)."""
        if closure is None:
            raise TypeError("LBFGS.step() needs a closure that reevaluates the model and returns the loss")
        if step_trace.current() is not None:
            raise RuntimeError(
                "LBFGS.step calls its closure a data-dependent number of times and cannot be part of an xgrad.compile'd "
                "step: call it eagerly (the closure may call a compiled function)"
            )
        group = self.param_groups[0]
        lr = float(group["lr"])
        max_iter, max_eval = group["max_iter"], group["max_eval"]
        tolerance_grad, tolerance_change = group["tolerance_grad"], group["tolerance_change"]
        line_search_fn, history_size = group["line_search_fn"], group["history_size"]
        state: dict[str, Any] = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        with enable_grad():
            orig_loss = closure()
        loss = -float(orig_loss) if group["maximize"] else float(orig_loss)
        current_evals = 1
        state["func_evals"] += 1
        flat_grad = self._gather_flat_grad()
        if jnp.max(jnp.abs(flat_grad)) <= tolerance_grad:
            return orig_loss

        d: Any = state.get("d")
        t: Any = state.get("t")
        old_dirs: Any = state.get("old_dirs")
        old_stps: Any = state.get("old_stps")
        ro: Any = state.get("ro")
        h_diag: Any = state.get("H_diag")
        prev_flat_grad: Any = state.get("prev_flat_grad")
        prev_loss: Any = state.get("prev_loss")
        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            if state["n_iter"] == 1:
                d, old_dirs, old_stps, ro, h_diag = -flat_grad, [], [], [], 1
            else:
                y = flat_grad - prev_flat_grad
                s = d * t
                ys = y @ s
                if ys > 1e-10:  # update the memory (a curvature pair) only where it keeps H positive definite
                    if len(old_dirs) == history_size:
                        old_dirs.pop(0)
                        old_stps.pop(0)
                        ro.pop(0)
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    h_diag = ys / (y @ y)
                # The two-loop recursion: d = -H g.
                al = state.setdefault("al", [None] * history_size)
                q = -flat_grad
                for i in range(len(old_dirs) - 1, -1, -1):
                    al[i] = (old_stps[i] @ q) * ro[i]
                    q = q - al[i] * old_dirs[i]
                d = q * h_diag
                for i in range(len(old_dirs)):
                    be_i = (old_dirs[i] @ d) * ro[i]
                    d = d + (al[i] - be_i) * old_stps[i]
            prev_flat_grad = flat_grad
            prev_loss = loss
            t = float(min(1.0, 1.0 / float(jnp.sum(jnp.abs(flat_grad))))) * lr if state["n_iter"] == 1 else lr
            gtd = flat_grad @ d
            if gtd > -tolerance_change:
                break

            ls_func_evals = 0
            opt_cond = False
            if line_search_fn is not None:
                if line_search_fn != "strong_wolfe":
                    raise RuntimeError("only 'strong_wolfe' is supported")
                obj_func = functools.partial(self._directional_evaluate, closure, [p._array for p in self._params])
                loss, flat_grad, t, ls_func_evals = _strong_wolfe(obj_func, t, d, loss, flat_grad, gtd, max_ls=max_eval - current_evals)
                self._add_grad(t, d)
                opt_cond = bool(jnp.max(jnp.abs(flat_grad)) <= tolerance_grad)
            else:
                self._add_grad(t, d)
                if n_iter != max_iter:
                    loss = self._evaluate(closure)
                    flat_grad = self._gather_flat_grad()
                    opt_cond = bool(jnp.max(jnp.abs(flat_grad)) <= tolerance_grad)
                    ls_func_evals = 1
            current_evals += ls_func_evals
            state["func_evals"] += ls_func_evals
            if n_iter == max_iter or current_evals >= max_eval or opt_cond:
                break
            if jnp.max(jnp.abs(d * t)) <= tolerance_change or abs(loss - prev_loss) < tolerance_change:
                break

        state.update(d=d, t=t, old_dirs=old_dirs, old_stps=old_stps, ro=ro, H_diag=h_diag,
                     prev_flat_grad=prev_flat_grad, prev_loss=prev_loss)
        return orig_loss

    def _ensure_state(self, param: Tensor, group: dict[str, Any]) -> None:
        """LBFGS keeps Python values and lists in its state, made by its step."""

    def _load_param_state(self, param: Tensor, group: dict[str, Any], saved: Any) -> None:
        self.state.pop(param, None)
        if saved:
            self.state[param].update({k: loaded_value(v) for k, v in saved.items()})

    def _has_stepped(self, state: dict[str, Any]) -> bool:
        return bool(state)

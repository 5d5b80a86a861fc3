"""Run one candidate of any op family under the interpreter and check it against float64."""
from tritune.kernels.family import family
from tritune.schedules.config import Config
from tritune.tuner.worker.candidate import rel_error


def run_case(expr, config: Config, seed: int = 0, kernel_expr=None) -> tuple[float, float]:
    """(relative error, tolerance) of one launch; kernel_expr builds a different kernel (to test the check)."""
    fam = family(expr.op)
    x = fam.inputs(expr, seed, "cpu")
    built = kernel_expr or expr
    fam.kernel(built, config, fam.problem_of(built, x.args))(*x.args)
    return rel_error(x.out, fam.reference(expr, x.args)), fam.tolerance(expr)

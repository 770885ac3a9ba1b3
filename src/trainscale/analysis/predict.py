"""Predicting throughput past the measured cells: a model of one training step,
fitted to a study's own records and checked against cells it never saw.

For one series (a framework at one model, image size, batch per GPU and
knobs), a step on `nodes` x `gpus` replicas (p = nodes * gpus) takes

    step      = compute + exposed
    compute   = batch / (the 1-GPU run's images/sec)      (no communication there)
    exposed   = max(0, exchange - overlap * backward)     backward = 2/3 of compute
    exchange  = what the framework moves per step, as its registry entry says
                (trainscale.catalogue.traffic.Traffic): f ring passes over B bytes (trainable
                parameters x bytes per element on the wire: 2 with fp16
                compression, else 4); an all-reduce of the gradient is f = 2,
                ZeRO-3 and FSDP (all-gather in forward and in backward,
                reduce-scatter) f = 3. The all-reduce's terms below scale by f/2.
                A framework whose traffic the model cannot say (a sharded one
                on CPU, where gloo's reduce-scatter is a whole all-reduce) is
                refused, in one line, rather than fitted with the wrong bytes.
    allreduce = the gradient's all-reduce (f = 2):
      ring:         2(p-1)/p * B / bandwidth + 2(p-1) * latency, over the
                    slowest link the ring crosses: the node's own (intra) on
                    one node, the network (inter) across nodes. NCCL's and
                    Horovod's default, one flat ring over every replica.
      hierarchical: an intra-node ring over the node's GPUs, then an
                    inter-node ring over the nodes carrying the node's whole
                    B through its network link: 2(g-1)/g * B / bw_intra +
                    2(g-1) * lat_intra + 2(n-1)/n * B / bw_inter + 2(n-1) * lat_inter.
      parameter-server: every one of the p workers sends its gradient to the
                    s servers and reads the parameters back, so each
                    server's link carries p/s * 2 * B:
                    2 p/s * B / bandwidth + 2 * latency, over the node's own
                    link on one node, the network across nodes. Where the
                    ring's time per link stays under 2B as p grows, this one
                    grows with p: the servers' links bind (seed 001's claim).
                    Its latency term is the same at every size, as is the
                    hidden share of the backward pass: the fit knows their
                    difference only, and predicts with it. One worker still
                    exchanges, so the compute time comes from the ecosystem's
                    single device (Series.single_cells).

and images/sec = p * batch / step. The five parameters (bandwidth and
latency, intra- and inter-node, and the overlapped fraction of the backward
pass) are fitted by least squares on the relative error of the step time over
the series' measured multi-GPU cells, for both algorithms; the one that fits
better is kept and named. A link no fitted cell crosses cannot be fitted: it
is taken equal to the other one, and the parameter table says so.

Uncertainty is a bootstrap (BOOTSTRAP_FITS fits): each cell's mean is redrawn
from its record's timed blocks (resampled with replacement), or, for records
with no blocks (the published ones), from a normal with the record's std.
The 95 % band of a prediction adds to the refits' spread a resampled
relative residual of the fit, so it bounds a new measurement, not only the
model's mean.

Held-out validation: the same fit on the smaller cells only (nodes at most
half the study's largest, or, on one node, GPUs at most half the largest),
against the larger cells it did not see, as a mean absolute percentage
error (MAPE) per series, and how many of them fall inside the 95 % band.

Needs NumPy, SciPy and pandas: no TensorFlow, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainscale.catalogue.registry import label

ALGORITHMS = ("ring", "hierarchical")
# What a series whose framework's traffic is a parameter server's is fitted with.
PARAMETER_SERVER = "parameter-server"
# The grid predicted when a study's config names none (the schema's defaults).
PREDICT_NODES = (1, 2, 4, 8, 16, 32, 64)
PREDICT_GPUS_PER_NODE = (4,)
BOOTSTRAP_FITS = 200
BACKWARD_SHARE = 2 / 3  # of a step's compute: the backward pass is about 2 forwards
# The parameter vector: seconds per byte and seconds per ring step, per link.
PARAMETERS = ("seconds_per_byte_intra", "latency_intra", "seconds_per_byte_inter",
              "latency_inter", "overlap")  # fmt: skip


class PredictError(Exception):
    """A series that cannot be fitted (why, in one line)."""


@dataclass(frozen=True)
class Cell:
    nodes: int
    gpus_per_node: int
    images_per_sec: float
    std: float
    samples: tuple[float, ...] = ()

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def redrawn(self, rng: np.random.Generator) -> Cell:
        """The cell with its mean redrawn: from its blocks, or its std."""
        if len(self.samples) > 1:
            mean = float(np.mean(rng.choice(self.samples, size=len(self.samples))))
        else:
            mean = float(rng.normal(self.images_per_sec, self.std or 0.0))
        return Cell(self.nodes, self.gpus_per_node, max(mean, 1e-9), self.std, self.samples)


@dataclass(frozen=True)
class Series:
    framework: str
    model: str
    image_size: int
    batch_size: int
    knobs: str
    gradient_bytes: int
    cells: tuple[Cell, ...]
    # Ring passes over the gradient per step (trainscale.catalogue.traffic.Traffic).
    passes: float = 2.0
    refused: str = ""  # why the model cannot say what a step moves ("" if it can)
    # A parameter server's servers (trainscale.catalogue.traffic.Traffic); 0: a ring.
    servers: int = 0
    # Where the compute time comes from when not the series' own 1-GPU cells:
    # one parameter-server worker still exchanges with its servers, so its
    # ecosystem's single device's cells (the same model and batch) say it.
    single_cells: tuple[Cell, ...] = ()
    # The inter-node link (seconds per byte, seconds per ring step) when it is
    # fixed, to the network probe's numbers (trainscale.analysis.predict_probe), not fitted.
    inter_link: tuple[float, float] | None = None

    @property
    def name(self) -> str:
        knobs = f", {self.knobs}" if self.knobs else ""
        return f"{label(self.framework)}, {self.model} b{self.batch_size}{knobs}"


@dataclass(frozen=True)
class StepModel:
    """One fitted step: compute seconds, the five parameters, the algorithm."""

    compute: float
    parameters: tuple[float, ...]  # in PARAMETERS order
    algorithm: str
    gradient_bytes: int
    batch_size: int
    tied: tuple[str, ...] = ()  # links taken equal to the other (no cell crossed them)
    passes: float = 2.0
    servers: int = 0

    def step_seconds(self, nodes, gpus_per_node) -> np.ndarray:
        return step_seconds(
            self.parameters,
            self.compute,
            self.gradient_bytes,
            self.algorithm,
            nodes,
            gpus_per_node,
            self.passes,
            self.servers,
        )

    def images_per_sec(self, nodes, gpus_per_node) -> np.ndarray:
        nodes, gpus_per_node = np.asarray(nodes), np.asarray(gpus_per_node)
        return nodes * gpus_per_node * self.batch_size / self.step_seconds(nodes, gpus_per_node)


def allreduce_terms(
    gradient_bytes, algorithm, nodes, gpus_per_node, passes: float = 2.0, servers: int = 0
) -> np.ndarray:
    """Per cell, what multiplies each link parameter (seconds per byte, latency;
    intra then inter) in the exchange's seconds: a (cells, 4) matrix. The
    all-reduce's (2 passes), or the parameter server's (2: send and receive),
    scaled to the framework's `passes`."""
    n = np.atleast_1d(np.asarray(nodes, dtype=float))
    g = np.atleast_1d(np.asarray(gpus_per_node, dtype=float))
    p = n * g
    across = (n > 1)[:, None]
    if algorithm in ("ring", PARAMETER_SERVER):
        if algorithm == "ring":
            link = np.stack([2 * (p - 1) / p * gradient_bytes, 2 * (p - 1)], axis=1)
        else:
            link = np.stack([2 * p / max(servers, 1) * gradient_bytes, np.full_like(p, 2)], axis=1)
        terms = np.concatenate([np.where(across, 0, link), np.where(across, link, 0)], axis=1)
    else:
        intra = np.stack([2 * (g - 1) / g * gradient_bytes, 2 * (g - 1)], axis=1)
        inter = np.stack([2 * (n - 1) / n * gradient_bytes, 2 * (n - 1)], axis=1)
        terms = np.concatenate([intra, inter], axis=1)
    return terms * (passes / 2)


def allreduce_seconds(
    parameters, gradient_bytes, algorithm, nodes, gpus_per_node, passes=2.0, servers=0
) -> np.ndarray:
    """Seconds of one step's exchange (module docstring)."""
    terms = allreduce_terms(gradient_bytes, algorithm, nodes, gpus_per_node, passes, servers)
    return terms @ np.asarray(parameters[:4], dtype=float)


def step_seconds(
    parameters, compute, gradient_bytes, algorithm, nodes, gpus_per_node, passes=2.0, servers=0
):
    communication = allreduce_seconds(
        parameters, gradient_bytes, algorithm, nodes, gpus_per_node, passes, servers
    )
    hidden = parameters[4] * BACKWARD_SHARE * compute
    return compute + np.maximum(0.0, communication - hidden)


# --------------------------------------------------------------------------
# Fitting
# --------------------------------------------------------------------------


def _links_seen(cells, algorithm) -> set[str]:
    """The links (intra, inter) some multi-GPU cell's all-reduce crosses (a
    parameter server's: every cell's exchange, one worker's too)."""
    if algorithm == PARAMETER_SERVER:
        return {"inter" if cell.nodes > 1 else "intra" for cell in cells}
    seen = set()
    for cell in cells:
        if cell.nodes > 1:
            seen.add("inter")
        if cell.gpus_per_node > 1 and (algorithm == "hierarchical" or cell.nodes == 1):
            seen.add("intra")
    return seen


@dataclass(frozen=True)
class _Problem:
    """A series' cells set up for fitting: each multi-GPU cell's measured step,
    the terms that multiply its free link parameters, and its known seconds
    of exchange (over a fixed link)."""

    compute: float
    measured: np.ndarray
    terms: np.ndarray
    known: np.ndarray
    tied: tuple[str, ...]
    fixed: tuple[float, float] | None  # the inter-node link, when not fitted

    def parameters(self, free) -> tuple[float, ...]:
        """The five parameters (PARAMETERS) from the free ones (links, overlap)."""
        if self.fixed:
            links = (*(self.fixed if "intra" in self.tied else free[:2]), *self.fixed)
        else:
            links = tuple(free[:2]) * 2 if self.tied else tuple(free[:4])
        return (*(float(v) for v in links), float(free[-1]))

    def residuals(self, free) -> np.ndarray:
        hidden = free[-1] * BACKWARD_SHARE * self.compute
        exposed = np.maximum(0.0, self.terms @ np.asarray(free[:-1]) + self.known - hidden)
        return (self.compute + exposed) / self.measured - 1

    def jacobian(self, free) -> np.ndarray:
        """d residuals / d free, exactly (zero where the max() is flat)."""
        hidden = free[-1] * BACKWARD_SHARE * self.compute
        shows = (self.terms @ np.asarray(free[:-1]) + self.known - hidden) > 0
        overlap = np.full((len(self.measured), 1), -BACKWARD_SHARE * self.compute)
        return np.hstack([self.terms, overlap]) * shows[:, None] / self.measured[:, None]


def _problem(series: Series, cells, algorithm: str) -> _Problem:
    if series.refused:
        raise PredictError(f"not fitted: {series.refused}, so a step's traffic is unknown")
    if series.servers:
        single = list(series.single_cells)
        multi = list(cells)  # one worker exchanges too
        if not single:
            raise PredictError(
                "no 1-device cell of its ecosystem's base: the compute time per step is unknown"
            )
    else:
        single = [c for c in cells if c.gpus == 1]
        multi = [c for c in cells if c.gpus > 1]
    if not single:
        raise PredictError("no 1-GPU cell: the compute time per step is unknown")
    compute = series.batch_size / float(np.mean([c.images_per_sec for c in single]))
    seen = _links_seen(multi, algorithm)
    if not seen:
        raise PredictError("no multi-GPU cell to fit the communication to")
    fixed = series.inter_link
    # A link no cell crossed takes the other's values (a fixed one's, if fixed).
    tied = tuple(sorted({"intra", "inter"} - seen - ({"inter"} if fixed else set())))
    nodes = np.array([c.nodes for c in multi])
    gpus = np.array([c.gpus_per_node for c in multi])
    measured = series.batch_size * nodes * gpus / np.array([c.images_per_sec for c in multi])
    terms = allreduce_terms(
        series.gradient_bytes, algorithm, nodes, gpus, series.passes, series.servers
    )
    if fixed:  # only the intra-node link is free (its columns are zero where unseen)
        known = terms[:, 2:] @ np.asarray(fixed)
        return _Problem(compute, measured, terms[:, :2], known, tied, fixed)
    if tied:  # the link no cell crossed: its columns join the other's
        terms = terms[:, :2] + terms[:, 2:]
    return _Problem(compute, measured, terms, np.zeros(len(multi)), tied, None)


def _grid_start(problem: _Problem) -> np.ndarray:
    """The best overlap on a grid, each with its links by non-negative least squares."""
    from scipy.optimize import nnls

    terms, measured = problem.terms, problem.measured
    exposed = measured - problem.compute - problem.known
    shows = exposed > 0.005 * measured  # communication above the noise
    scale = np.linalg.norm(terms, axis=0)
    scale[scale == 0] = 1
    candidates = []
    for overlap in np.linspace(0, 1, 21):
        links = np.zeros(terms.shape[1])
        if shows.any():
            weights = 1 / measured[shows]
            target = (exposed[shows] + overlap * BACKWARD_SHARE * problem.compute) * weights
            solution, _ = nnls(terms[shows] / scale * weights[:, None], target)
            links = solution / scale
        free = np.append(links, overlap)
        candidates.append((float(np.sum(problem.residuals(free) ** 2)), free))
    return min(candidates, key=lambda candidate: candidate[0])[1]


def fit_step_model(series: Series, cells=None, algorithm: str = "ring") -> tuple[StepModel, float]:
    """The least-squares fit on `cells` (default: all of the series'); returns
    the model and its root-mean-square relative error of the step time.

    The max() in the step makes the problem non-convex (a link whose cells
    are all hidden has no gradient), so the overlap is searched on a grid:
    with it fixed, the all-reduce is linear in the link parameters, solved by
    non-negative least squares on the cells that show communication; the
    best grid point is then refined with all five free. A series whose
    inter-node link is fixed (Series.inter_link) fits the other three, its
    intra-node link taking the fixed one's values where no cell crosses it.
    """
    from scipy.optimize import least_squares

    problem = _problem(series, list(series.cells if cells is None else cells), algorithm)
    start = _grid_start(problem)
    step_scale = np.append(np.where(np.arange(len(start) - 1) % 2 == 0, 1e-10, 1e-5), 0.1)
    refined = least_squares(
        problem.residuals,
        start,
        jac=problem.jacobian,
        bounds=(np.zeros(len(start)), np.append(np.full(len(start) - 1, np.inf), 1.0)),
        x_scale=step_scale,
        method="trf",
    )
    start_cost = np.sum(problem.residuals(start) ** 2)
    best = refined.x if 2 * refined.cost <= start_cost else start
    model = StepModel(
        problem.compute,
        problem.parameters(best),
        algorithm,
        series.gradient_bytes,
        series.batch_size,
        problem.tied,
        series.passes,
        series.servers,
    )
    rms = float(np.sqrt(np.mean(problem.residuals(best) ** 2)))
    return model, rms


def best_fit(series: Series, cells=None) -> tuple[StepModel, float]:
    """Both all-reduce algorithms fitted, the one with the smaller error kept;
    a parameter server's series, its own."""
    algorithms = (PARAMETER_SERVER,) if series.servers else ALGORITHMS
    fits = [fit_step_model(series, cells, algorithm) for algorithm in algorithms]
    return min(fits, key=lambda fit: fit[1])


@dataclass
class Bootstrap:
    """A point fit and its bootstrap refits, to predict with a band."""

    model: StepModel
    rms: float
    refits: list[StepModel] = field(default_factory=list)
    residuals: np.ndarray = field(default_factory=lambda: np.zeros(1))

    def predict(self, nodes, gpus_per_node, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Images/sec at each (nodes, gpus): the point fit's, and the 95 % band."""
        nodes, gpus_per_node = np.asarray(nodes), np.asarray(gpus_per_node)
        point = self.model.images_per_sec(nodes, gpus_per_node)
        draws = np.array([refit.images_per_sec(nodes, gpus_per_node) for refit in self.refits])
        noise = rng.choice(self.residuals, size=draws.shape)
        draws = draws * (1 + noise)
        low, high = np.percentile(draws, [2.5, 97.5], axis=0)
        return point, low, high


def bootstrap(series: Series, cells=None, fits: int = BOOTSTRAP_FITS, seed: int = 0) -> Bootstrap:
    cells = list(series.cells if cells is None else cells)
    model, rms = best_fit(series, cells)
    rng = np.random.default_rng(seed)
    refits = []
    for _ in range(fits):
        redrawn = [cell.redrawn(rng) for cell in cells]
        refits.append(fit_step_model(series, redrawn, model.algorithm)[0])
    measured = np.array([c.images_per_sec for c in cells])
    fitted = model.images_per_sec([c.nodes for c in cells], [c.gpus_per_node for c in cells])
    residuals = measured / fitted - 1
    return Bootstrap(model, rms, refits, residuals)

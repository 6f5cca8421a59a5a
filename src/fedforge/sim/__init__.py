"""System simulation: client speeds and availability, delay laws, the event clock and
costs. The schedulers that run on this clock live in ``fedforge.schedulers``."""

from fedforge.sim.clock import EventClock, Job, kth_arrival_round
from fedforge.sim.cost import DEVICE_FLOPS, CostModel, build_cost_model
from fedforge.sim.delays import ConstantDelay, DelayLaw, ShiftedExponential, TraceDelay, build_delay
from fedforge.sim.population import FEDAST_SPEED_CLASSES, Population, speed_factors
from fedforge.sim.rounds import SyncRoundClock

__all__ = [
    "DEVICE_FLOPS", "CostModel", "build_cost_model",
    "FEDAST_SPEED_CLASSES", "ConstantDelay", "DelayLaw", "EventClock", "Job", "Population",
    "ShiftedExponential", "SyncRoundClock", "TraceDelay", "build_delay", "kth_arrival_round",
    "speed_factors",
]

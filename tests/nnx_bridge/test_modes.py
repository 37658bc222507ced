"""modes.take_mode_arguments: the train/eval keywords `to_linen` takes for `train()` / `eval()`."""

import functools

import numpy as np
import pytest
from flax import nnx

from nnx_bridge import modes
from nnx_bridge.errors import BridgeError


def call_without_switch(x):
  return x


def call_with_deterministic(x, *, deterministic: bool):
  return x


def call_with_kwargs(x, **kwargs):
  return x


def call_with_positional_only_train(x, train, /):
  return x


class Module(nnx.Module):

  def __init__(self, din, *, use_running_average: bool = False):
    self.din = din


@pytest.mark.parametrize(
    'kwargs, eval_mode',
    [
        ({'train': True}, False),
        ({'train': False}, True),
        ({'training': True}, False),
        ({'is_training': False}, True),
        ({'deterministic': True}, True),
        ({'deterministic': False}, False),
        ({'use_running_average': np.bool_(True)}, True),
        ({'train': True, 'deterministic': False}, False),
        ({}, None),
    ],
)
def test_mode_arguments_the_target_does_not_take_become_the_eval_mode(kwargs, eval_mode):
  got, rest = modes.take_mode_arguments({**kwargs, 'scale': 2}, call_without_switch, where='w')
  assert got is eval_mode and rest == {'scale': 2}


@pytest.mark.parametrize(
    'target, taken',
    [
        (call_with_deterministic, {'train'}),
        (call_with_kwargs, set()),  # a **kwargs target takes every keyword
        (call_with_positional_only_train, {'train', 'deterministic'}),
        (Module, {'train', 'deterministic'}),  # a class: its __init__, not nnx's metaclass
        (functools.partial(Module, 3), set()),  # no signature beyond (*args, **kwargs)
    ],
)
def test_arguments_the_target_takes_are_left_for_it(target, taken):
  kwargs = {'train': False, 'deterministic': True, 'use_running_average': True}
  if target is not Module:
    kwargs.pop('use_running_average')
  eval_mode, rest = modes.take_mode_arguments(kwargs, target, where='w')
  assert set(rest) == set(kwargs) - taken
  assert eval_mode is (True if taken else None)


def test_non_bool_and_contradicting_modes_are_rejected():
  with pytest.raises(BridgeError, match=r"^w: train=1 must be a Python bool.*static_argnames=\['train'\]"):
    modes.take_mode_arguments({'train': 1}, call_without_switch, where='w')
  with pytest.raises(BridgeError, match=r'^w: train=True, deterministic=True contradict each other'):
    modes.take_mode_arguments({'train': True, 'deterministic': True}, call_without_switch, where='w')

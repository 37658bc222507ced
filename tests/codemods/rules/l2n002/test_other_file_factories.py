"""A factory field given a class another file of the run converted (`factory_scan`): dopamine's CALE networks,
`sac_cls: nn.Module = continuous_networks.ActorCriticNetwork`, built in setup() with `self.sac_cls(...)` and called
through its methods. The field makes that class, so the class holding it converts with it; the port runs against
its Linen original on transferred parameters."""

from __future__ import annotations

import jax
from flax import nnx

import nnx_bridge
from tests.codemods.rules.l2n002.test_other_files import _two_trees

CONTINUOUS = '''\
"""Actor and critic networks in the style of dopamine's continuous_networks."""
from typing import Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp


class ActorNetwork(nn.Module):
  action_shape: Tuple[int, ...]
  hidden_units: int = 8

  @nn.compact
  def __call__(self, state):
    x = nn.relu(nn.Dense(self.hidden_units)(state))
    return jnp.tanh(nn.Dense(self.action_shape[0])(x))


class CriticNetwork(nn.Module):
  hidden_units: int = 8

  @nn.compact
  def __call__(self, state, action):
    x = jnp.concatenate((state, action), axis=-1)
    x = nn.relu(nn.Dense(self.hidden_units)(x))
    return nn.Dense(1)(x)


class ActorCriticNetwork(nn.Module):
  action_shape: Tuple[int, ...]
  hidden_units: int = 8

  def setup(self):
    self._actor = ActorNetwork(self.action_shape, self.hidden_units)
    self._critic = CriticNetwork(self.hidden_units)

  def __call__(self, state):
    action = self._actor(state)
    return action, self._critic(state, action)

  def actor(self, state):
    return self._actor(state)

  def critic(self, state, action):
    return self._critic(state, action)
'''

CALE = '''\
"""A convolutional actor-critic in the style of dopamine's labs/cale networks: the actor-critic class is a field."""
from typing import Tuple
import logging

import flax.linen as nn
import jax

from agents import continuous_networks


class Encoder(nn.Module):
  projection_dimension: int = 6

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(features=4, kernel_size=(3, 3), strides=(2, 2))(x))
    x = x.reshape((x.shape[0], -1))
    return nn.relu(nn.Dense(self.projection_dimension)(x))


class CALEConvNetwork(nn.Module):
  action_shape: Tuple[int, ...]
  hidden_units: int = 8
  sac_cls: nn.Module = continuous_networks.ActorCriticNetwork

  def setup(self):
    logging.info('Creating %s...', self.__class__.__name__)
    self._encoder = Encoder()
    self._sac_network = self.sac_cls(self.action_shape, self.hidden_units)

  def __call__(self, state, mean_action: bool = True):
    encoding = self._encoder(state)
    action = self._sac_network.actor(encoding)
    if not mean_action:
      action = action + 0.1
    return action, self._sac_network.critic(jax.lax.stop_gradient(encoding), action)
'''

STATE = jax.random.normal(jax.random.key(1), (2, 8, 8, 3))


def _cale(tmp_path, monkeypatch, edit=None):
  files = {'agents/__init__.py': '', 'agents/continuous_networks.py': CONTINUOUS, 'agents/cale.py': CALE}
  return _two_trees(tmp_path, monkeypatch, files, 'agents.cale', edit)


def _port(module):
  """The converted network; the critic takes the encoding (6) and the action (2)."""
  return module.CALEConvNetwork((2,), _encoder_conv_in_features=3, _encoder_linear_in_features=64,
                                _sac_network__actor_linear1_in_features=6,
                                _sac_network__critic_linear1_in_features=8, rngs=nnx.Rngs(0))


def test_a_factory_field_given_a_class_another_file_converted_converts_with_it(tmp_path, monkeypatch):
  result, linen, ported = _cale(tmp_path, monkeypatch)
  converted = {c.linen_name for o in result.files for c in o.classes}
  assert {'CALEConvNetwork', 'ActorCriticNetwork', 'Encoder'} <= converted, \
      [e.message for o in result.files for e in o.entries if e.kind == 'todo']
  code = (tmp_path / 'nnx' / 'agents' / 'cale.py').read_text()
  assert 'sac_cls: nnx.Module = continuous_networks.ActorCriticNetwork' in code, code
  assert "logging.info('Creating %s...', self.__class__.__name__)" in code
  assert 'self._sac_network = self.sac_cls(self.action_shape, self.hidden_units, ' in code, code
  model = _port(ported)
  original = linen.CALEConvNetwork((2,))
  variables = original.init(jax.random.key(0), STATE)
  report = nnx_bridge.compare(original, variables, model, STATE)
  assert report.ok, report.to_text()
  assert {d.path for d in report.differences if d.check == 'gradient'} >= {
      '_sac_network/_actor/linear1/kernel', '_sac_network/_critic/linear2/bias', '_encoder/conv/kernel'}


def test_the_comparison_of_a_class_built_through_another_files_factory_rejects_a_wrong_port(tmp_path, monkeypatch):
  """The same check fails when the converted actor-critic stops the critic's gradient at the action too."""
  _, linen, ported = _cale(tmp_path, monkeypatch, ('agents/cale.py', lambda code: code.replace(
      'jax.lax.stop_gradient(encoding), action)', 'jax.lax.stop_gradient(encoding), jax.lax.stop_gradient(action))')))
  original = linen.CALEConvNetwork((2,))
  report = nnx_bridge.compare(original, original.init(jax.random.key(0), STATE), _port(ported), STATE)
  assert not report.ok and any(d.check == 'gradient' for d in report.failures), report.to_text()

"""Collection <-> Variable type registry."""

import pickle
import subprocess
import sys

import pytest
from flax import nnx

import nnx_bridge
from nnx_bridge import collectionlib


@pytest.mark.parametrize(
    'collection, var_type',
    [
        ('params', nnx.Param),
        ('batch_stats', nnx.BatchStat),
        ('cache', nnx.Cache),
        ('intermediates', nnx.Intermediate),
        ('perturbations', nnx.Perturbation),
    ],
)
def test_builtin_collections_map_to_flax_types(collection, var_type):
  assert nnx_bridge.variable_type(collection) is var_type
  assert nnx_bridge.collection_name(var_type) == collection


@pytest.mark.parametrize('collection', ['losses', 'my-stats', 'x00'])
def test_custom_collection_gets_a_named_picklable_type(collection):
  var_type = nnx_bridge.variable_type(collection)
  assert issubclass(var_type, nnx.Variable)
  assert var_type.__module__ == 'nnx_bridge.collectionlib'
  assert nnx_bridge.variable_type(collection) is var_type
  assert nnx_bridge.collection_name(var_type) == collection
  assert pickle.loads(pickle.dumps(var_type)) is var_type


def test_custom_collection_type_is_stable_across_processes():
  var_type = nnx_bridge.variable_type('cross_process_losses')
  payload = pickle.dumps(var_type(1.0))
  script = (
      'import pickle, sys, nnx_bridge\n'
      'v = pickle.loads(sys.stdin.buffer.read())\n'
      'assert nnx_bridge.collection_name(type(v)) == "cross_process_losses", type(v)\n'
      'print(type(v).__qualname__)\n'
  )
  result = subprocess.run(
      [sys.executable, '-c', script], input=payload, capture_output=True, check=True
  )
  assert result.stdout.decode().strip() == var_type.__qualname__


def test_register_collection_as_decorator_and_conflicts():
  @nnx_bridge.register_collection('counters')
  class Counter(nnx.Variable):
    pass

  assert nnx_bridge.variable_type('counters') is Counter
  assert nnx_bridge.collection_name(Counter) == 'counters'
  assert nnx_bridge.register_collection('counters', Counter) is Counter  # idempotent

  class Other(nnx.Variable):
    pass

  with pytest.raises(ValueError, match="'counters' is already mapped to .*Counter"):
    nnx_bridge.register_collection('counters', Other)
  with pytest.raises(ValueError, match="already the type of collection 'counters'"):
    nnx_bridge.register_collection('counters_2', Counter)


def test_unregistered_subclass_uses_its_parents_collection():
  class RunningMax(nnx.BatchStat):
    pass

  assert nnx_bridge.collection_name(RunningMax) == 'batch_stats'


def test_type_without_a_collection_is_an_error():
  class Orphan(nnx.Variable):
    pass

  with pytest.raises(ValueError, match='Orphan has no Linen collection.*register_collection'):
    collectionlib.collection_name(Orphan)

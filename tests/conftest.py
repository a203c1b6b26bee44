"""Fixtures shared by all test folders; plugins keep each fixture next to what it sets up."""

pytest_plugins = ["tests.cluster.fixtures", "tests.support.redis_server", "tests.support.models", "tests.support.serving_fixtures"]

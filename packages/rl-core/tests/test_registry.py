import pytest

from rl_core.registry import PluginLoadError, Registry, UnknownPluginError


def test_local_registration_and_lookup():
    reg = Registry("rl.test_things")
    reg.register("alpha", int)

    @reg.register("beta")
    class Beta:
        pass

    assert reg.get("alpha") is int
    assert reg.get("beta") is Beta
    assert reg.names() == ["alpha", "beta"]
    assert "beta" in reg and "gamma" not in reg
    assert reg.build("alpha", "7") == 7


def test_unknown_name_lists_installed_and_suggests():
    reg = Registry("rl.test_things", kind="engine")
    reg.register("fsdp", object)
    with pytest.raises(UnknownPluginError) as err:
        reg.get("fsdpp")
    msg = str(err.value)
    assert "unknown engine 'fsdpp'" in msg
    assert "installed: fsdp" in msg
    assert "did you mean 'fsdp'" in msg


def test_duplicate_registration_is_an_error_unless_overwrite():
    reg = Registry("rl.test_things")
    reg.register("a", int)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a", float)
    reg.register("a", float, overwrite=True)
    assert reg.get("a") is float


def test_entry_point_that_fails_to_import_names_the_extra(monkeypatch):
    from importlib.metadata import EntryPoint

    ep = EntryPoint(name="broken", value="rl_core_missing_module:Thing", group="rl.test_things")
    reg = Registry("rl.test_things", kind="engine")
    monkeypatch.setattr(reg, "_entry_points", lambda: {"broken": ep})
    with pytest.raises(PluginLoadError) as err:
        reg.get("broken")
    assert "rl_core_missing_module" in str(err.value)
    assert "pip install" in str(err.value)

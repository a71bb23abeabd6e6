"""`kvlab presets`: the two tables and their JSON form."""

import json

from kvlab.cli import main
from kvlab.cli.commands.presets import format_table
from kvlab.specs import list_hardware, list_models


def test_presets_prints_every_model_and_hardware_preset(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert set(list_models()) <= rows and set(list_hardware()) <= rows


def test_presets_shows_kv_kib_per_token(capsys):
    main(["presets"])
    llama_row = next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("llama-2-7b ")
    )
    assert llama_row.split()[-2:] == ["512", "4,096"]


def test_presets_json_holds_every_field_of_every_preset(capsys):
    assert main(["presets", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["models"]["mixtral-8x7b"]["num_active_params"] == 12_879_925_248
    assert document["hardware"]["h200-141g"]["hbm_bandwidth"] == 4.8e12
    assert set(document["models"]) == set(list_models())


def test_table_columns_line_up():
    table = format_table(("name", "size"), [["a", "1"], ["longer", "1,000"]])
    assert table.splitlines() == ["name     size", "a           1", "longer  1,000"]


def test_presets_show_layers_by_kind(capsys):
    main(["presets"])
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("qwen3-next-80b-a3b "))
    assert "statex36,fullx12" in row


def test_a_hybrid_presets_json_block_is_a_valid_spec_file(tmp_path, capsys):
    from kvlab.specs import get_model

    main(["presets", "--json"])
    block = json.loads(capsys.readouterr().out)["models"]["gemma-3-27b"]
    path = tmp_path / "gemma.json"
    path.write_text(json.dumps(block))
    assert get_model(str(path)) == get_model("gemma-3-27b")


def test_presets_show_host_memory_per_device(capsys):
    """Memory tiers are sized against a device's share of the host's DRAM: shown."""
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "host GiB/device" in out
    row = next(line for line in out.splitlines() if line.startswith("h100-80g"))
    assert row.split()[-2] == "256"

"""The quick tier (``bash scripts/test.sh -m quick``): every layer in a few minutes, before each commit.

Each layer of ``tpu_demo`` names the tests that cover it: ids relative to ``tests/``, a whole file
or ``file::test`` (every parametrization of it). ``conftest.py`` marks them ``quick``; a test may
also carry ``@pytest.mark.quick`` itself. ``test_quick_tier.py`` checks that every layer has an entry
and that every entry names a test that exists, so a rename cannot shrink the tier unseen.
What the tier leaves out (browsers, nginx, torchrun ranks, the fresh venv, benchmarks, training)
runs in the full suite: the README's test command and CI.
"""

QUICK_TIER: dict[str, tuple[str, ...]] = {
    "architecture": ("test_architecture.py", "test_quick_tier.py"),
    "core": ("test_links.py", "test_buckets_and_config.py::test_parse_bucket", "test_buckets_and_config.py::test_bad_buckets_are_refused",
             "test_web_units.py::test_optional_fields_may_be_left_out_but_required_ones_not",
             "test_web_units.py::test_png_settings_are_read_from_chunk_headers_within_bounds",
             "test_styles.py::test_style_fields_are_validated_naming_the_field"),
    "device": ("test_device.py::test_detects_cpu_here", "test_device.py::test_cpu_mode_descriptions_say_what_runs",
               "test_device.py::test_eager_modes_run_compiled_functions_eagerly",
               "test_device.py::test_a_google_pci_device_or_a_loaded_torch_tpu_sends_detection_to_torch_tpu",
               "test_tpu_path.py::test_detection_picks_the_tpu_when_torch_tpu_reports_chips",
               "test_tpu_path.py::test_seed_compiled_whole_moves_to_tpu_and_compiles_the_full_transformer_once"),
    "models": ("test_catalog_placement.py::test_catalog_holds_the_source_document_models",
               "test_catalog_placement.py::test_automatic_placement_matches_the_source_document_on_a_v6e",
               "test_placement_plan.py::test_placements_per_chip",
               "test_prompt_upsampling.py::test_held_out_phrasings_are_read",
               "test_prompt_upsampling.py::test_the_projects_phrasing_sets_keep_every_named_attribute_in_any_case",
               "test_prompt_upsampling.py::test_links_and_pngs_carry_the_typed_prompt_and_the_checkbox",
               "test_prompt_upsampling.py::test_the_model_cards_rewrite_example_prints_what_it_shows"),
    "distributed": ("test_tpu_path.py::test_seed_tensor_parallel_uses_tpu_dist_a_tpu_mesh_and_passes_it_to_both_models",),
    "engine": ("test_engine.py::test_returns_n_images_of_the_bucket_size_seeded_seed_plus_i",
               "test_engine.py::test_compiled_mode_compiles_each_bucket_once_then_never",
               "test_preview_stream.py::test_a_fast_image_gets_no_preview_and_a_slow_one_gets_one_per_interval",
               "test_styles.py::test_images_of_different_styles_never_share_a_call"),
    "launch": ("test_buckets_and_config.py::test_flags_and_environment",
               "test_buckets_and_config.py::test_bad_flag_exits_2_with_one_line",
               "test_tensor_parallel.py::test_tensor_parallel_flags_and_environment",
               "test_check.py::test_check_on_this_cpu_host_prints_the_cpu_plan_and_exits_0"),
    # the one real app start: python app.py's composition on loopback, a generation through the API
    "web": ("test_app.py::test_generate_streams_one_gallery_update_per_image",
            "test_web_units.py::test_warmup_throttle_allows_one_per_address_per_interval",
            "test_web_units.py::test_busy_reason_counts_waiting_sessions_and_addresses",
            "test_mcp.py::test_a_cancel_is_tied_to_one_running_call_of_that_address_or_to_none"),
}


def selects(nodeid: str) -> bool:
    """Whether the test ``nodeid`` (as pytest names it, ``tests/...``) is in QUICK_TIER."""
    test = nodeid.removeprefix("tests/")
    return any(test == entry or test.startswith((entry + "::", entry + "["))
               for entries in QUICK_TIER.values() for entry in entries)

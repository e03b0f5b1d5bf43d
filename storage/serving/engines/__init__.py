"""Each serving engine's settings for one measured run. This step moves storage/serving/engine_settings.py into the
package unchanged (engines/common.py); the next splits it into one module per engine."""

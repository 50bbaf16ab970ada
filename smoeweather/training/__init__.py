"""smoeweather.training"""

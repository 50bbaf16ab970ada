"""smoeweather.models"""
